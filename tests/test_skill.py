"""skills/capdiag/SKILL.md, the agent skill: its front matter is an agent skill's, every capdiag
command it shows runs (as written, in a folder holding the inputs it names), and the commands it
asks the user to run on the serving host are the ones whose output capdiag reads."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from capdiag.launcher import run

ROOT = Path(__file__).resolve().parents[1]
SKILL = ROOT / "skills" / "capdiag" / "SKILL.md"
TESTS = ROOT / "tests"
BIN = Path(sys.executable).parent
COMMIT = "0123456789abcdef0123456789abcdef01234567"
HOST_TOOLS = {"kubectl", "docker", "nvidia-smi", "hf"}


def _blocks(language: str) -> list[str]:
    text = SKILL.read_text(encoding="utf-8")
    lines = [line for block in re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)
             for line in block.splitlines()]
    return [line for line in lines if line.strip() and not line.startswith("#")]


COMMANDS = _blocks("sh")


def test_front_matter_is_an_agent_skills():
    text = SKILL.read_text(encoding="utf-8")
    match = re.match(r"^---\nname: (\S+)\ndescription: >-\n((?:  .*\n)+)---\n", text)
    assert match, "SKILL.md starts with name and description front matter"
    name, description = match.group(1), " ".join(line.strip() for line in match.group(2).splitlines())
    assert name == SKILL.parent.name and re.fullmatch(r"[a-z0-9-]+", name)
    assert 50 < len(description) <= 1024 and "Use when" in description
    for heading in ("## When to use it", "## Inputs to collect", "## Commands", "## How to read the report",
                    "## Known limits"):
        assert heading in text


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A folder with the files the skill's commands name, in the formats the user would bring."""
    work = tmp_path_factory.mktemp("skill")
    shutil.copy(ROOT / "capdiag" / "examples" / "sglang-llama31-8b-h100.log", work / "sglang.log")
    shutil.copy(TESTS / "fixtures" / "single_gpu_ready.log", work / "sglang-after.log")
    shutil.copy(TESTS / "fixtures" / "vllm_v092_tp2.log", work / "vllm.log")
    shutil.copy(TESTS / "plan_configs" / "llama-3.1-8b.json", work / "config.json")
    # `nvidia-smi --query-gpu=index,memory.used,memory.free --format=csv,noheader` on the H100
    (work / "smi.csv").write_text("0, 69400 MiB, 11800 MiB\n")
    # a running vLLM's `curl http://HOST:PORT/metrics > metrics.txt`
    shutil.copy(TESTS / "endpoint_cases" / "vllm-v0110.metrics.txt", work / "metrics.txt")
    # the baseline the gate command reads, as the baseline command writes it
    code = subprocess.run([sys.executable, "-m", "capdiag", "baseline", str(work / "sglang.log"), "-o",
                           str(work / "baseline.json")], capture_output=True, timeout=120).returncode
    assert code == 0
    (work / "logs").mkdir()
    for name in ("sglang.log", "sglang-after.log", "vllm.log"):
        shutil.copy(work / name, work / "logs" / name)
    snapshot = work / "hf" / "models--Qwen--Qwen2.5-7B-Instruct" / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text(COMMIT)
    shutil.copy(TESTS / "inputs" / "config_qwen25_7b.json", snapshot / "config.json")
    return work


def test_the_skill_shows_the_commands_it_should():
    assert len(COMMANDS) >= 20 and all(c.startswith(("capdiag ", "cat ")) for c in COMMANDS)
    shown = " ".join(COMMANDS)
    for command in ("capdiag explain", "capdiag diff", "capdiag gate", "capdiag plan", "capdiag rules",
                    "capdiag probe", "capdiag baseline"):
        assert command in shown


def _hub(command: str) -> bool:
    """Whether the command reads the Hugging Face cache (huggingface_hub fixes its paths from the
    environment when it is imported, so only a process of its own can be pointed at the test's)."""
    return "--model " in command


def _in_process(command: str, workdir: Path, monkeypatch) -> tuple[int, str, str]:
    """The command as the shell would run it (`cat FILE | capdiag …` feeds FILE on stdin), through
    the CLI's own entry point in this process: exit code, stdout, stderr."""
    words = shlex.split(command)
    stdin = b""
    if "|" in words:
        cut = words.index("|")
        assert words[0] == "cat" and cut == 2, command
        stdin, words = (workdir / words[1]).read_bytes(), words[cut + 1:]
    assert words[0] == "capdiag", command
    monkeypatch.chdir(workdir)
    monkeypatch.setattr(sys, "argv", words)
    with CliRunner().isolation(input=stdin, env={"COLUMNS": "100"}) as streams:
        try:
            run()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        return code, streams[0].getvalue().decode(), streams[1].getvalue().decode()


def _subprocess(command: str, workdir: Path) -> tuple[int, str, str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "HF_HUB_OFFLINE": "1",
           "HF_HUB_CACHE": str(workdir / "hf"), "HF_HOME": str(workdir / "hf-home"), "COLUMNS": "100"}
    proc = subprocess.run(["bash", "-c", command], cwd=workdir, capture_output=True, text=True, timeout=120, env=env)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_runs(command, workdir, monkeypatch):
    if _hub(command):
        pytest.importorskip("huggingface_hub")
        if not (BIN / "capdiag").exists():
            pytest.skip("console script not installed next to python")
        code, stdout, stderr = _subprocess(command, workdir)
    else:
        code, stdout, stderr = _in_process(command, workdir, monkeypatch)
    allowed = (0, 1) if shlex.split(command)[:2] == ["capdiag", "gate"] else (0,)
    assert code in allowed, f"{command}: {stderr}"
    assert "Traceback" not in stderr
    written = re.search(r"(?:--output|-o) (\S+)", command)  # a command that writes a file says so on stderr
    output = (workdir / written.group(1)).read_text() if written else stdout
    assert output.strip()
    if re.search(r"--format json(\s|$)", command):
        json.loads(output)
    if "--format jsonl" in command:
        assert [json.loads(line)["schema"] for line in output.splitlines()] == ["capdiag.report/1"] * 3
    if "--trace" in command:
        assert stderr.startswith("#")


@pytest.mark.skipif(not (BIN / "capdiag").exists(), reason="console script not installed next to python")
def test_a_command_runs_from_the_shell_as_written(workdir):
    """The installed console script, from a shell, in the folder: what the in-process runs stand for."""
    code, stdout, stderr = _subprocess(COMMANDS[4], workdir)  # `cat sglang.log | capdiag explain --format json`
    assert code == 0 and not stderr, stderr
    assert json.loads(stdout)["schema"] == "capdiag.report/1"


def test_host_commands_are_the_ones_capdiag_reads():
    host = _blocks("bash")
    assert host and all(shlex.split(line)[0] in HOST_TOOLS for line in host)
    assert "nvidia-smi --query-gpu=index,memory.used,memory.free --format=csv,noheader > smi.csv" in host
