"""A small log's start-up cost: parsers loaded from the user's private cache (and only from a
trusted one), Jinja left unloaded for JSON, `--version` answered before the CLI loads."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from capdiag import cache, launcher
from capdiag.cli import main
from capdiag.parsing import lalr
from capdiag.parsing.lalr import grammar_sources, lalr_parser

EXAMPLE = Path(__file__).resolve().parent.parent / "capdiag" / "examples" / "sglang-llama31-8b-h100.log"
LINE = "[2026-03-02 09:14:19] KV Cache is allocated. #tokens: 415615, K size: 25.37 GB, V size: 25.37 GB"


def _cached(directory: Path) -> list[Path]:
    return sorted(directory.glob("sglang.lark.*.lalr"))


def test_a_cached_parser_parses_as_the_built_one(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPDIAG_CACHE_DIR", str(tmp_path / "c"))
    built = lalr_parser("sglang.lark", lexer="contextual")
    (path,) = _cached(tmp_path / "c")
    assert (path.stat().st_mode & 0o777) == 0o600 and ((tmp_path / "c").stat().st_mode & 0o777) == 0o700
    before = path.stat().st_mtime_ns
    loaded = lalr_parser("sglang.lark", lexer="contextual")
    assert path.stat().st_mtime_ns == before  # read, not rebuilt
    assert loaded is not built and loaded.parse(LINE) == built.parse(LINE)


def test_other_options_are_another_cache_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPDIAG_CACHE_DIR", str(tmp_path))
    lalr_parser("sglang.lark", lexer="contextual")
    lalr_parser("sglang.lark", lexer="basic")
    assert len(_cached(tmp_path)) == 2


def test_an_edit_to_the_shared_grammar_is_another_cache_entry(tmp_path, monkeypatch):
    """The key covers what `%import .common` pulls in, not only the grammar's own text."""
    assert set(grammar_sources("vllm.lark")) == {"vllm.lark", "common.lark"}
    assert set(grammar_sources("pyliteral.lark")) == {"pyliteral.lark"}  # `%import common.X` is Lark's own
    monkeypatch.setenv("CAPDIAG_CACHE_DIR", str(tmp_path))
    lalr_parser("sglang.lark", lexer="contextual")
    real = lalr.grammar_sources

    def edited(name):
        return {n: text + "\n// edited" if n == "common.lark" else text for n, text in real(name).items()}
    monkeypatch.setattr(lalr, "grammar_sources", edited)
    assert lalr_parser("sglang.lark", lexer="contextual").parse(LINE)
    assert len(_cached(tmp_path)) == 2


def test_every_grammar_builds_without_a_cache(tmp_path, monkeypatch):
    """Built afresh, each grammar finds its imports: ours beside it, Lark's own library."""
    monkeypatch.setenv("CAPDIAG_CACHE_DIR", str(tmp_path / "shared"))
    (tmp_path / "shared").mkdir(mode=0o777)
    os.chmod(tmp_path / "shared", 0o777)  # a cache open to others is not used
    for grammar in ("sglang.lark", "vllm.lark", "pyliteral.lark", "traceback.lark", "nvidia_smi.lark"):
        assert lalr_parser(grammar).terminals


def test_a_directory_open_to_others_is_not_used(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    monkeypatch.setenv("CAPDIAG_CACHE_DIR", str(shared))
    assert cache.cache_dir() is None
    lalr_parser("sglang.lark", lexer="contextual").parse(LINE)
    assert not list(shared.iterdir())


def test_xdg_cache_home_is_the_default_place(tmp_path, monkeypatch):
    monkeypatch.delenv("CAPDIAG_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.cache_dir() == tmp_path / "capdiag"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # the XDG spec says: ignore it
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "capdiag"


def test_a_damaged_or_foreign_writable_file_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPDIAG_CACHE_DIR", str(tmp_path))
    lalr_parser("sglang.lark", lexer="contextual")
    (path,) = _cached(tmp_path)
    path.write_bytes(b"not a pickle")
    assert lalr_parser("sglang.lark", lexer="contextual").parse(LINE)
    assert path.read_bytes() != b"not a pickle"
    # a file others may write is not loaded, whatever it holds: it is replaced by our own
    os.chmod(path, 0o666)
    with open(path, "rb") as fh:
        assert not cache.trusted(fh)
    assert lalr_parser("sglang.lark", lexer="contextual").parse(LINE)
    assert (path.stat().st_mode & 0o777) == 0o600


def test_version_is_answered_as_click_would(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["capdiag", "--version"])
    launcher.run()
    assert capsys.readouterr().out == CliRunner().invoke(main, ["--version"]).output


def test_a_json_report_does_not_load_jinja_and_a_text_one_caches_its_templates(tmp_path):
    script = ("import sys; from capdiag import api; r = api.explain(sys.argv[1]); r.render(sys.argv[2]); "
              "print('jinja2' in sys.modules)")
    env = {**os.environ, "CAPDIAG_CACHE_DIR": str(tmp_path)}
    run = lambda fmt: subprocess.run([sys.executable, "-c", script, str(EXAMPLE), fmt], env=env,  # noqa: E731
                                     capture_output=True, text=True, timeout=120, check=True).stdout
    assert run("json") == "False\n"
    assert run("text") == "True\n"
    assert list(tmp_path.glob("__jinja2_*.cache"))


def test_a_line_no_state_can_lex_fails_where_lark_s_own_lexer_says(tmp_path, monkeypatch):
    """The state lexer raises at the column Lark's contextual lexer names (the damage reading
    cuts there) without building a lexer of every terminal to name the token."""
    from lark import Lark
    from lark.exceptions import UnexpectedInput

    monkeypatch.setenv("CAPDIAG_CACHE_DIR", str(tmp_path))
    ours = lalr_parser("vllm.lark", lexer="contextual")
    source, text = lalr.FromPackageLoader(lalr._PACKAGE)(None, "vllm.lark")
    larks = Lark(text, parser="lalr", lexer="contextual", source_path=source,
                 import_paths=[lalr.FromPackageLoader(lalr._PACKAGE, ())])
    for line in ("[2026-03-02 09:14:28] INFO:     Application startup complete.",
                 "INFO 10-14 19:25:09 [gpu_worker.py:298] Available KV cache memory: 9.93 GiB, then §",
                 "(EngineCore_DP0 pid=4512) INFO 10-14 19:25:09 [kv_cache_utils.py:1087] GPU KV cache size: x tokens"):
        with pytest.raises(UnexpectedInput) as mine:
            ours.parse(line)
        with pytest.raises(UnexpectedInput) as theirs:
            larks.parse(line)
        assert mine.value.pos_in_stream == theirs.value.pos_in_stream
    assert all(lexer._scanner is None for lexer in [ours.parser.lexer.root_lexer])
