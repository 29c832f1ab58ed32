"""Launch commands as configuration: wrapped by `\\` or by the author, `vllm serve`, the API
server module, `docker run` of a vLLM image; a value from a command is labelled as from the
command and the log's own statement wins where both exist. Fixtures written in the real formats."""
from __future__ import annotations

from capdiag.source import candidate_lines
from helpers import corpus_report, fixture, write_log


def joined(*physical: str) -> list[str]:
    return [l.text for l in candidate_lines(enumerate(physical, 1))]


def test_backslash_continuations_join_into_one_command():
    assert joined("$ vllm serve Qwen/Qwen3-8B \\", "    --max-model-len 8192 \\", "    -tp 2", "INFO 01-01 00:00:00 x") == [
        "$ vllm serve Qwen/Qwen3-8B --max-model-len 8192 -tp 2"]


def test_author_wrapped_options_continue_the_command():
    lines = candidate_lines(enumerate([
        "python3 -m sglang.bench_one_batch --batch-size 1 --input 512",
        "--output 64 --model-path meta-llama/Llama-3.1-70B-Instruct --tp 4",
        "--cuda-graph-max-bs 8", "", "max_total_num_tokens=120000"], 1))
    first = next(lines)
    assert first.number == 1 and first.text.endswith("--tp 4 --cuda-graph-max-bs 8")
    assert first.raw.count("\n") == 2  # the evidence keeps the three physical lines


def test_an_ordinary_line_after_a_command_is_not_swallowed():
    assert joined("vllm serve m", "--tp 2 is what I used", "INFO 01-01 [x.py:1] Model loading took 1.0 GiB") == [
        "vllm serve m --tp 2 is what I used", "INFO 01-01 [x.py:1] Model loading took 1.0 GiB"]


def test_sglang_command_wrapped_by_its_author_gives_model_tp_and_fraction():
    report = corpus_report(fixture("sglang_wrapped_command.log"))
    config, sources = report["config"], report["config_sources"]
    assert config["model"] == "Qwen/Qwen2.5-32B-Instruct" and config["tp_size"] == 4
    assert config["mem_fraction_static"] == 0.81
    assert sources["tp_size"] == "launch command --tp 4"
    assert sources["model"] == "launch command --model-path Qwen/Qwen2.5-32B-Instruct"


def test_docker_run_of_a_vllm_image_and_the_log_winning_over_it():
    report = corpus_report(fixture("vllm_docker_run_command.log"))
    config, sources = report["config"], report["config_sources"]
    # the command says --max-model-len 8192, the log's own args line 16384: the log wins
    assert config["max_model_len"] == 16384 and sources["max_model_len"].startswith("namespace args")
    assert config["model"] == "microsoft/phi-4"


def test_docker_run_alone_configures_the_run(tmp_path):
    log = write_log(tmp_path, "\n".join([
        "$ docker run --gpus '\"device=1\"' ... vllm/vllm-openai:v0.11.0 Qwen/Qwen3-14B \\",
        "    --tensor-parallel-size 1 --gpu-memory-utilization 0.55 --max-model-len 16384",
        "",
        "INFO [gpu_model_runner.py:2602] Model loading took 27.5223 GiB and 8.410321 seconds",
        "INFO [gpu_worker.py:298] Available KV cache memory: 11.18 GiB",
    ]) + "\n")
    report = corpus_report(log)
    config, sources = report["config"], report["config_sources"]
    assert (config["model"], config["tp_size"], config["gpu_memory_utilization"], config["max_model_len"]) == (
        "Qwen/Qwen3-14B", 1, 0.55, 16384)
    assert sources["gpu_memory_utilization"] == "launch command --gpu-memory-utilization 0.55"
    assert sources["model"].startswith("launch command")


def test_api_server_module_with_short_options(tmp_path):
    log = write_log(tmp_path, "python -m vllm.entrypoints.openai.api_server --model facebook/opt-125m -tp 2 -pp 2\n"
                              "INFO 06-01 10:00:00 [gpu_model_runner.py:1347] Model loading took 0.2389 GiB and 1.2 seconds\n")
    report = corpus_report(log)
    assert report["config"]["tp_size"] == 2 and report["config"]["pp_size"] == 2
    assert report["config_sources"]["tp_size"] == "launch command -tp 2"


def test_an_argv_list_printed_over_lines_joins_behind_its_ray_prefix():
    tag = "(ServeReplica:default:VLLMDeployment pid=4711)"
    assert joined(f"{tag} ['vllm',", f"{tag}  'serve',", f"{tag}  'm',", f"{tag}  '--max_num_seqs',", f"{tag}  '8']",
                  f"{tag} INFO 03-02 10:00:04 [x.py:1] Using max model len 32768") == [
        f"{tag} ['vllm', 'serve', 'm', '--max_num_seqs', '8']",
        f"{tag} INFO 03-02 10:00:04 [x.py:1] Using max model len 32768"]


def test_a_pprint_argv_without_prefix_joins_too_and_stops_at_its_close():
    assert joined("['python3',", " '-m',", " 'vllm.entrypoints.openai.api_server',", " '--model',", " 'org/m']",
                  " 'not part of it',") == [
        "['python3', '-m', 'vllm.entrypoints.openai.api_server', '--model', 'org/m']"]


def test_ray_argv_list_configures_the_request_limit():
    """The Ray Serve replica printed its engine's argv one element a line: max_num_seqs 8 binds
    the concurrency (the token limit alone would give 238 at 4096 tokens)."""
    report = corpus_report(fixture("vllm_ray_argv_list.log"))
    config, sources = report["config"], report["config_sources"]
    assert config["model"] == "Qwen/Qwen2.5-7B-Instruct"
    assert config["max_running_requests"] == 8 and config["gpu_memory_utilization"] == 0.85
    assert sources["max_running_requests"] == "launch command --max-num-seqs 8"
    first = report["concurrency"][0]
    assert (first["token_limit"], first["request_limit"], first["max_concurrent"]) == (238, 8, 8)


def test_an_argv_list_without_options_is_no_command():
    from capdiag.parsing.vllm import argv_launch, parse_vllm_line
    assert argv_launch(["a", "b"]) is None
    assert parse_vllm_line("Supported_tasks: ['generate', 'embed']") == []
    cls, values = argv_launch(["python", "-m", "vllm.entrypoints.openai.api_server", "--model=org/m", "--tp", "2",
                               "--enforce-eager", "--seed", "-1"])
    assert values == {"program": "vllm.entrypoints.openai.api_server",
                      "args": {"model": "org/m", "tp": "2", "enforce_eager": None, "seed": "-1"}}


def test_an_argv_list_goes_on_past_other_processes_lines_and_split_strings():
    """Ray interleaves its actors: another process's line, glued to an element or on its own
    line, is read on its own and the list goes on; pprint splits a long element into adjacent
    strings, the first with no comma after it."""
    tag, other = "(vLLMHttpServer pid=31001)", "(vLLMHttpServer pid=31042)"
    assert joined(f"{tag} ['serve',", f"{tag}  'm',", f"{tag}  '--seed',",
                  f"{tag}  '0',(WorkerDict pid=29917) INFO:2026-05-11 Memory cleanup attempt 1: Freed 0.00 GB",
                  "(raylet) [2026-05-11 10:02:12,114 E 28001 28033] (raylet) file_system_monitor.cc:116: disk full",
                  "", f"{other} INFO 05-11 10:02:14 [config/model.py:1750] Using max model len 8192",
                  f"{tag}  '--override_generation_config',", f"{tag}  '{{\"top_p\": 1.0, '",
                  f"{tag}  '\"max_new_tokens\": 1024}}',", f"{tag}  '--max_num_seqs',", f"{tag}  '16']") == [
        f"{other} INFO 05-11 10:02:14 [config/model.py:1750] Using max model len 8192",
        f"{tag} ['serve', 'm', '--seed', '0', '--override_generation_config', '{{\"top_p\": 1.0, ' "
        f"'\"max_new_tokens\": 1024}}', '--max_num_seqs', '16']"]


def test_two_rollout_replicas_in_one_file_are_one_start_up_configured_by_their_argv(tmp_path):
    """verl's two vLLMHttpServer actors start side by side: the second's engine record comes from
    another server process, a replica, not a restart; the first's argv (max_num_seqs 16, sleep
    mode) configures the start-up, and the free memory of a server that sleeps for the trainer is
    no waste."""
    log = fixture("vllm_verl_two_replicas.log")
    report = corpus_report(log)
    assert report["source"]["launches"] == 1
    assert report["config"]["max_running_requests"] == 16 and report["config"]["gpu_memory_utilization"] == 0.4
    first = report["concurrency"][0]
    assert (first["token_limit"], first["request_limit"], first["max_concurrent"]) == (260, 16, 16)
    from capdiag.analysis import analyse
    a = analyse(log, gpu_total_gib=79.19)
    assert a.knowledge.value("config", "sleep_mode") is True
    assert "excess-headroom" not in {f.rule for f in a.knowledge.topic("finding") if hasattr(f, "rule")}
    # the same record again from the same server process is a restart, as before
    text = open(log, encoding="utf-8").read().replace("(vLLMHttpServer pid=31042) (EngineCore_DP0 pid=31322)",
                                                      "(vLLMHttpServer pid=31001) (EngineCore_DP0 pid=31322)")
    again = analyse(write_log(tmp_path, text))
    assert len(again.launches) == 2
