__version__ = "0.1.0"
# The project's home (pyproject.toml's [project.urls] says the same; a test keeps them equal).
PROJECT_URL = "https://github.com/capdiag/capdiag"
RULES_DOC_URL = PROJECT_URL + "/blob/main/docs/rules.md"
