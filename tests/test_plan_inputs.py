"""`capdiag plan`'s inputs: a bare --params, KV sizing from the command line's shape, --from-log
taking the log's settings, remedies that were planned again, impossible layouts, and --model
through huggingface_hub against a Hugging Face cache the test builds (offline: no network)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import run_entry

CONFIGS = Path(__file__).resolve().parent / "plan_configs"
EXAMPLE = str(Path(__file__).resolve().parents[1] / "capdiag" / "examples" / "sglang-llama31-8b-h100.log")
CAPDIAG = Path(sys.executable).with_name("capdiag")
COMMIT = "0123456789abcdef0123456789abcdef01234567"
# Llama-3.1-70B's published shape and checkpoint size (model.safetensors.index.json total_size)
LLAMA_70B_BYTES = 141_107_412_992


def plan_json(monkeypatch, capsys, *args):
    code, out, err = run_entry(monkeypatch, capsys, "plan", *args, "--format", "json")
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("given, written", [("70", "70B or 7e10"), ("8", "8B or 8e9"), ("0.5", "0.5B or 5e8")])
def test_a_bare_small_params_says_how_to_write_it(given, written, monkeypatch, capsys):
    code, _, err = run_entry(monkeypatch, capsys, "plan", "--params", given, "--gpu", "h100_sxm")
    assert code == 2 and len(err.splitlines()) == 1
    assert err == f"capdiag: error: --params {given}: a bare number counts single parameters; for {given} billion " \
                  f"write {written}\n"


@pytest.mark.parametrize("given, count", [("70B", 70e9), ("7e10", 7e10), ("70000000000", 7e10)])
def test_params_written_out_are_taken(given, count, monkeypatch, capsys):
    assert plan_json(monkeypatch, capsys, "--params", given, "--gpu", "h100_sxm")["parameters"] == count


def test_params_with_the_shape_sizes_kv_without_a_config(monkeypatch, capsys):
    shape = plan_json(monkeypatch, capsys, "--params", "70B", "--weight-dtype", "bf16", "--layers", "80", "--kv-heads",
                      "8", "--head-dim", "128", "--hidden", "8192", "--workload", "8192x16", "--gpu", "h100_sxm",
                      "--tp", "8")
    config = plan_json(monkeypatch, capsys, "--config-json", str(CONFIGS / "llama-3.1-70b.json"),
                       "--workload", "8192x16", "--gpu", "h100_sxm", "--tp", "8")
    assert shape["per_gpu"]["kv_bytes_per_token"]["value"] == config["per_gpu"]["kv_bytes_per_token"]["value"] == 40960
    # 70 B counted at 2 B is 16.30 GiB a rank; config.json's 70.55 B (embeddings and head) is 16.43
    assert shape["per_gpu"]["weights_gib"]["value"] == 16.41 and config["per_gpu"]["weights_gib"]["value"] == 16.54
    assert shape["verdict"] == config["verdict"] == "fits"


def test_a_partial_shape_says_what_is_missing(monkeypatch, capsys):
    code, _, err = run_entry(monkeypatch, capsys, "plan", "--params", "70B", "--layers", "80")
    assert code == 2 and "needs --kv-heads, --head-dim" in err


def test_from_log_takes_the_logs_settings_and_keeps_a_workload(monkeypatch, capsys):
    args = ("--config-json", str(CONFIGS / "llama-3.1-8b.json"), "--workload", "8192x16", "--gpu", "h100_sxm")
    with_log = plan_json(monkeypatch, capsys, *args, "--from-log", EXAMPLE)
    assert with_log["inputs"]["workloads"] == [{"context": 8192, "requests": 16}]
    assert with_log["settings"]["fraction"] == 0.838  # the log's mem_fraction_static, not SGLang's default
    assert "the workload's 131,072 tokens fit" in with_log["reason"]
    assert with_log["from_log"]["comparison"]


def test_does_not_fit_offers_only_changes_that_were_planned_again(tmp_path, monkeypatch, capsys):
    # QwQ-32B's shape (64 layers, 8 KV heads of 128, hidden 5120, 40 attention heads) on 2 × RTX 4090
    config = {"num_hidden_layers": 64, "num_key_value_heads": 8, "num_attention_heads": 40, "head_dim": 128,
              "hidden_size": 5120, "intermediate_size": 27648, "vocab_size": 152064, "model_type": "qwen2",
              "torch_dtype": "bfloat16"}
    path = tmp_path / "qwq-32b-config.json"
    path.write_text(json.dumps(config))
    doc = plan_json(monkeypatch, capsys, "--config-json", str(path), "--gpu", "rtx4090", "--gpus", "2",
                    "--workload", "8192x8")
    assert doc["verdict"] == "does_not_fit"
    assert "the weights alone" in doc["reason"]  # 30.62 GiB a GPU at TP 2 against 23.64
    # the workload needs 65,536 tokens: TP 4 leaves 0.61 GiB (9,994 tokens) and int4 weights at TP 2 59,637
    # tokens, so neither is offered; TP 8 holds 229,376
    assert [r["changes"] for r in doc["remedies"]] == [{"tp_size": 8}]
    assert doc["remedies"][0]["projected"]["kv_tokens"] == 229_376 > 8 * 8192
    code, out, _ = run_entry(monkeypatch, capsys, "plan", "--config-json", str(path), "--gpu", "rtx4090", "--gpus", "2",
                             "--workload", "8192x8")
    assert "WHAT WOULD FIT" in out and "shard over 8 GPUs (TP 8): 229376 KV tokens" in out


def test_fits_lists_no_remedies(monkeypatch, capsys):
    doc = plan_json(monkeypatch, capsys, "--config-json", str(CONFIGS / "llama-3.1-8b.json"), "--gpu", "h100_sxm")
    assert doc["verdict"] == "fits" and doc["remedies"] == [] and doc["no_remedy"] is None


def test_an_impossible_layout_does_not_fit(monkeypatch, capsys):
    doc = plan_json(monkeypatch, capsys, "--config-json", str(CONFIGS / "llama-3.1-8b.json"), "--gpu", "h100_sxm",
                    "--tp", "3")
    assert doc["verdict"] == "does_not_fit" and "TP 3 does not divide the model's 32 attention heads" in doc["reason"]
    assert [r["changes"] for r in doc["remedies"]][:1] == [{"tp_size": 4}]


# ---- --model through huggingface_hub, offline, against a cache built here --------------------------

def _hub_cache(root: Path, repo: str, files: dict[str, object]) -> Path:
    """A Hugging Face cache (hub layout: models--ORG--NAME/refs/main → snapshots/COMMIT/FILE)."""
    cache = root / "hub"
    model = cache / ("models--" + repo.replace("/", "--"))
    (model / "refs").mkdir(parents=True)
    (model / "refs" / "main").write_text(COMMIT)
    snapshot = model / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    for name, content in files.items():
        (snapshot / name).write_text(json.dumps(content))
    return cache


def _plan_offline(cache: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HOME": str(tmp / "hf-home"), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_TOKEN", None)
    return subprocess.run([str(CAPDIAG), "plan", *args], capture_output=True, text=True, timeout=60, env=env)


hub = pytest.mark.skipif(not CAPDIAG.exists(), reason="console script not installed next to python")


@hub
def test_model_from_the_cache_gives_the_exact_weight_bytes(tmp_path):
    pytest.importorskip("huggingface_hub")
    config = json.loads((CONFIGS / "llama-3.1-70b.json").read_text())
    cache = _hub_cache(tmp_path, "meta-llama/Llama-3.1-70B-Instruct",
                       {"config.json": config, "model.safetensors.index.json":
                        {"metadata": {"total_size": LLAMA_70B_BYTES}, "weight_map": {}}})
    proc = _plan_offline(cache, tmp_path, "--model", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "h100_sxm",
                         "--gpus", "8", "--workload", "8192x16", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    weights = doc["per_gpu"]["weights_gib"]
    # the checkpoint's bytes a rank, and what SGLang's load adds (measured: 0.11 GiB)
    assert weights["value"] == round(LLAMA_70B_BYTES / 2**30 / 8 + 0.11, 2) and "total_size" in weights["derivation"]
    assert doc["per_gpu"]["kv_bytes_per_token"]["value"] == 40960
    assert doc["totals"]["weights_gib"] == round(LLAMA_70B_BYTES / 2**30, 2)
    # a weight dtype asked for sizes from the parameters instead
    proc = _plan_offline(cache, tmp_path, "--model", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "h100_sxm",
                         "--gpus", "8", "--weight-dtype", "fp8", "--format", "json")
    weights = json.loads(proc.stdout)["per_gpu"]["weights_gib"]
    assert "total_size" not in weights["derivation"] and "fp8 per channel: 1 B" in weights["derivation"]


@hub
def test_model_without_a_safetensors_index_counts_parameters(tmp_path):
    pytest.importorskip("huggingface_hub")
    cache = _hub_cache(tmp_path, "acme/llama-8b", {"config.json": json.loads((CONFIGS / "llama-3.1-8b.json").read_text())})
    proc = _plan_offline(cache, tmp_path, "--model", "acme/llama-8b", "--gpu", "h100_sxm", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    weights = json.loads(proc.stdout)["per_gpu"]["weights_gib"]
    assert "× 2 B" in weights["derivation"]


@hub
@pytest.mark.parametrize("model, words", [("acme/not-cached", "not in the Hugging Face cache"),
                                          ("no-slash", "ORG/NAME")])
def test_a_missing_model_is_one_line(model, words, tmp_path):
    pytest.importorskip("huggingface_hub")
    proc = _plan_offline(tmp_path / "empty-cache", tmp_path, "--model", model, "--gpu", "h100_sxm")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("capdiag: error: --model") and words in proc.stderr
    assert len(proc.stderr.splitlines()) == 1


@pytest.mark.parametrize("error, words", [("GatedRepoError", "a gated model"),
                                          ("RepositoryNotFoundError", "no such model")])
def test_gated_and_unknown_models_are_one_line(error, words, monkeypatch, capsys):
    huggingface_hub = pytest.importorskip("huggingface_hub")
    from huggingface_hub import errors

    kind = getattr(errors, error)

    def refuse(*args, **kwargs):
        raise kind.__new__(kind)  # as the Hub's answer would (the HTTP response is not needed here)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", refuse)
    code, _, err = run_entry(monkeypatch, capsys, "plan", "--model", "meta-llama/Llama-3.1-70B", "--gpu", "h100_sxm")
    assert code == 2 and err.startswith("capdiag: error: --model meta-llama/Llama-3.1-70B: " + words)
    assert len(err.splitlines()) == 1


LLAMA_8B = json.loads((CONFIGS / "llama-3.1-8b.json").read_text()) if (CONFIGS / "llama-3.1-8b.json").exists() else {}


@hub
@pytest.mark.parametrize("name, index, words", [
    ("deep", "[" * 5000 + "]" * 5000, "is not valid JSON"),
    ("digits", '{"metadata": {"total_size": ' + "9" * 5001 + "}}", "is not valid JSON"),
    ("metadata-list", {"metadata": [1]}, None),
    ("total-true", {"metadata": {"total_size": True}}, None),
    ("nan", '{"metadata": {"total_size": NaN}}', "holds a number that is not finite"),
])
def test_a_hostile_hub_cache_is_one_line_or_ignored(name, index, words, tmp_path):
    """A cache file the plan cannot use is one line (exit 2), or, where only the index's total is
    unusable, the weights are sized from the parameters — never 0 GiB of weights that 'fits'."""
    pytest.importorskip("huggingface_hub")
    cache = _hub_cache(tmp_path, "acme/hostile", {"config.json": LLAMA_8B})
    snapshot = cache / "models--acme--hostile" / "snapshots" / COMMIT
    (snapshot / "model.safetensors.index.json").write_text(index if isinstance(index, str) else json.dumps(index))
    proc = _plan_offline(cache, tmp_path, "--model", "acme/hostile", "--gpu", "h100_sxm", "--format", "json")
    assert "Traceback" not in proc.stderr
    if words:
        assert proc.returncode == 2 and words in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    else:
        assert proc.returncode == 0, proc.stderr
        weights = json.loads(proc.stdout)["per_gpu"]["weights_gib"]
        assert "× 2 B" in weights["derivation"] and weights["value"] > 10  # 8B parameters, not 0 GiB


@hub
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_a_fifo_or_device_in_the_hub_cache_is_refused_not_read(tmp_path):
    pytest.importorskip("huggingface_hub")
    cache = _hub_cache(tmp_path, "acme/fifo", {})
    snapshot = cache / "models--acme--fifo" / "snapshots" / COMMIT
    os.mkfifo(snapshot / "config.json")  # nobody writes: open() would wait forever
    proc = _plan_offline(cache, tmp_path, "--model", "acme/fifo", "--gpu", "h100_sxm")
    assert proc.returncode == 2 and "config.json in the Hugging Face cache is not a regular file" in proc.stderr
    os.unlink(snapshot / "config.json")
    os.symlink("/dev/zero", snapshot / "config.json")
    proc = _plan_offline(cache, tmp_path, "--model", "acme/fifo", "--gpu", "h100_sxm")
    assert proc.returncode == 2 and "not a regular file" in proc.stderr
