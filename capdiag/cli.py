"""Command line: `capdiag explain LOG` and `capdiag facts LOG`. Wiring only."""
from __future__ import annotations

import json
import os
import sys
from importlib import resources
from typing import Optional

import attrs
import click

from capdiag import __version__, ruledocs
from capdiag.analysis import analyse, read_log
from capdiag.errors import InputError
from capdiag.launches import split_launches
from capdiag.render import FORMATS, render, render_diff, render_plan, render_trace
from capdiag import gate
from capdiag.gate import baseline_document, read_baseline
from capdiag.gate_render import GATE_FORMATS, render_gate, summary_markdown
from capdiag.policy import SEVERITIES, load_policy
from capdiag import facts as F
from capdiag.diffing import diff
from capdiag.probe import analyse_probe
from capdiag.planning import compare_with_log, parse_params, parse_workload, plan, request_from_log
from capdiag.report import build
from capdiag.rules.plan import BYTES_PER_WEIGHT
from capdiag.whatif import KEYS, parse_what_if
from capdiag.rules import find_rule

EXAMPLE_LOG = "sglang-llama31-8b-h100.log"
DEFAULT_FAIL_ON = "warning"


class Lengths(click.ParamType):
    """Comma-separated request lengths in tokens, e.g. 4096,8192."""

    name = "lengths"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        try:
            lengths = tuple(int(v) for v in str(value).split(",") if v.strip())
        except ValueError:
            self.fail("a comma-separated list of whole numbers, e.g. 4096,8192", param, ctx)
        if not lengths or any(n <= 0 for n in lengths):
            self.fail("request lengths must be positive whole numbers", param, ctx)
        return lengths


def _write(text: str, output: Optional[str]) -> None:
    if output:
        try:
            with open(output, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as exc:
            raise InputError(f"{output}: cannot be written ({exc.strerror})") from None
    else:
        click.echo(text, nl=False)


@click.group()
@click.version_option(__version__, prog_name="capdiag")
def main() -> None:
    """Explains where an LLM server's GPU memory went, from its start-up log."""


@main.command()
@click.argument("log")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True)
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Write the report here instead of stdout.")
@click.option("--target-rank", help="Rank to break down: a TP index (3) or tags (tp3, pp1, dp2, pp1,tp0). Default TP0.")
@click.option("--token-lengths", type=Lengths(), default="4096,6144,8192", show_default=True,
              help="Request lengths (tokens) for the concurrency table.")
@click.option("--gpu", help="GPU alias from references/gpu-specs.json (e.g. h100_sxm, h200, a100_80gb_sxm).")
@click.option("--gpu-total-gib", type=float, help="The GPU's total memory in GiB (beats --gpu's reference figure).")
@click.option("--launch", type=click.IntRange(min=1), help="Which start-up in the file (default: the last that got furthest).")
@click.option("--framework", type=click.Choice(("sglang", "vllm")), help="Skip detection: the log is this framework's.")
@click.option("--nvidia-smi-file", type=click.Path(dir_okay=False),
              help="nvidia-smi output: `--query-gpu=index,memory.used,memory.free --format=csv[,noheader]` or the table.")
@click.option("--config-json", type=click.Path(dir_okay=False), help="The model's config.json (theoretical KV bytes per token).")
@click.option("--trace", is_flag=True, help="Print the engine's firings (rule, conclusion, premises) to stderr.")
@click.option("--what-if", "what_if", multiple=True, metavar="KEY=VALUE",
              help="Project the start-up under a changed setting (repeatable): " + ", ".join(KEYS) + ".")
@click.option("--no-color", is_flag=True,
              help="No ANSI colours in the text report's bars (also off when NO_COLOR is set or stdout is not a terminal).")
@click.option("--no-runtime", is_flag=True,
              help="Skip the run-time section: do not read the request-time traffic lines (faster on long logs).")
def explain(log, fmt, output, target_rank, token_lengths, gpu, gpu_total_gib, launch, framework, nvidia_smi_file,
            config_json, trace, what_if, no_color, no_runtime):
    """Explain where each GPU's memory went in LOG (a path, - for stdin, a .gz file, or a running
    server's URL: see `capdiag probe`)."""
    if log.startswith(("http://", "https://")):
        a = analyse_probe(log, framework=framework, target_rank=target_rank, token_lengths=token_lengths, gpu=gpu,
                          gpu_total_gib=gpu_total_gib, what_if=parse_what_if(what_if))
        _write(render(build(a), fmt), output)
        return
    a = analyse(log, launch=launch, target_rank=target_rank, token_lengths=token_lengths, gpu=gpu,
                gpu_total_gib=gpu_total_gib, framework=framework, nvidia_smi=nvidia_smi_file,
                config_json=config_json, what_if=parse_what_if(what_if), runtime=not no_runtime)
    if trace:
        click.echo(render_trace(a.firings), err=True, nl=False)
    color = fmt == "text" and not output and not no_color and not os.environ.get("NO_COLOR") and sys.stdout.isatty()
    _write(render(build(a), fmt, color=color), output)


@main.command("probe")
@click.argument("url", required=False)
@click.option("--metrics-file", "metrics_files", multiple=True, type=click.Path(dir_okay=False),
              help="A saved scrape of /metrics instead of a URL (repeat, oldest first, for a series).")
@click.option("--framework", type=click.Choice(("sglang", "vllm")), help="Skip detection: the server is this framework.")
@click.option("--header", "headers", multiple=True, metavar="'NAME: VALUE'", help="An extra HTTP header (repeatable).")
@click.option("--token-env", metavar="VAR", help="Send `Authorization: Bearer $VAR` (the token stays out of the command line).")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True, help="Seconds per request.")
@click.option("--insecure", is_flag=True, help="Do not verify the server's TLS certificate.")
@click.option("--ca-cert", type=click.Path(dir_okay=False, exists=True), help="Verify TLS against this CA bundle.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True)
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Write the report here instead of stdout.")
@click.option("--gpu", help="GPU alias from references/gpu-specs.json.")
@click.option("--gpu-total-gib", type=float, help="The GPU's total memory in GiB.")
@click.option("--token-lengths", type=Lengths(), default="4096,6144,8192", show_default=True)
def probe_command(url, metrics_files, framework, headers, token_env, timeout, insecure, ca_cert, fmt, output, gpu,
                  gpu_total_gib, token_lengths):
    """Explain a running server from its own endpoints (SGLang /server_info, /v1/loads; vLLM /metrics,
    /v1/models, /version), or from saved scrapes of its /metrics."""
    a = analyse_probe(url, metrics_files, framework=framework, headers=headers, token_env=token_env, timeout=timeout,
                      verify=False if insecure else (ca_cert or True), gpu=gpu, gpu_total_gib=gpu_total_gib,
                      token_lengths=token_lengths)
    _write(render(build(a), fmt), output)


def _gate_options(func):
    """Options `gate` and `baseline` share with `explain`'s inputs."""
    for option in reversed((
            click.option("--policy", type=click.Path(dir_okay=False), help="A capdiag.toml policy."),
            click.option("--nvidia-smi-file", type=click.Path(dir_okay=False), help="nvidia-smi output (all logs)."),
            click.option("--config-json", type=click.Path(dir_okay=False), help="The model's config.json (all logs)."),
            click.option("--gpu", help="GPU alias from references/gpu-specs.json."),
            click.option("--gpu-total-gib", type=float, help="The GPU's total memory in GiB."),
            click.option("--framework", type=click.Choice(("sglang", "vllm")), help="Skip detection."),
    )):
        func = option(func)
    return func


def _verdict(logs, policy, nvidia_smi_file, config_json, gpu, gpu_total_gib, framework, fail_on=None, baseline=None):
    loaded = load_policy(policy) if policy else None
    level = fail_on or (loaded.fail_on if loaded else None) or DEFAULT_FAIL_ON
    entries = read_baseline(baseline) if baseline else None
    return gate.run(list(logs), fail_on=level, baseline=entries, policy=loaded, nvidia_smi=nvidia_smi_file,
                    config_json=config_json, gpu=gpu, gpu_total_gib=gpu_total_gib, framework=framework)


@main.command("gate")
@click.argument("logs", nargs=-1, required=True)
@_gate_options
@click.option("--fail-on", type=click.Choice(SEVERITIES), help=f"Lowest severity that fails (default: the policy's, "
              f"else {DEFAULT_FAIL_ON}).")
@click.option("--format", "fmt", type=click.Choice(GATE_FORMATS), default="text", show_default=True)
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Write the report here instead of stdout.")
@click.option("--baseline", type=click.Path(dir_okay=False), help="Accept the findings this baseline lists.")
@click.option("--exit-zero", is_flag=True, help="Report, but exit 0 even when the gate fails (input errors still exit 2).")
def gate_command(logs, policy, nvidia_smi_file, config_json, gpu, gpu_total_gib, framework, fail_on, fmt, output,
                 baseline, exit_zero):
    """Gate a deploy on the start-up logs: exit 0 pass, 1 a finding at or above --fail-on, 2 input error."""
    verdict = _verdict(logs, policy, nvidia_smi_file, config_json, gpu, gpu_total_gib, framework, fail_on, baseline)
    _write(render_gate(verdict, fmt), output)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if fmt == "github" and summary:
        try:
            with open(summary, "a", encoding="utf-8") as fh:
                fh.write(summary_markdown(verdict))
        except OSError as exc:
            raise InputError(f"GITHUB_STEP_SUMMARY {summary}: cannot be written ({exc.strerror})") from None
    sys.exit(verdict.exit_code(exit_zero))


@main.command("baseline")
@click.argument("logs", nargs=-1, required=True)
@_gate_options
@click.option("--output", "-o", type=click.Path(dir_okay=False), required=True, help="The baseline file to write.")
def baseline_command(logs, policy, nvidia_smi_file, config_json, gpu, gpu_total_gib, framework, output):
    """Write a baseline that accepts every finding the logs raise now."""
    verdict = _verdict(logs, policy, nvidia_smi_file, config_json, gpu, gpu_total_gib, framework)
    if verdict.errors:
        raise InputError(verdict.errors[0].error)
    document = baseline_document(verdict)
    _write(json.dumps(document, indent=2, ensure_ascii=False) + "\n", output)
    click.echo(f"capdiag: wrote {len(document['entries'])} baseline entries to {output}", err=True)


@main.command("plan")
@click.option("--config-json", type=click.Path(dir_okay=False), help="The model's config.json (shape, parameters).")
@click.option("--params", help="Parameter count, e.g. 70B (instead of counting from config.json).")
@click.option("--weight-dtype", type=click.Choice(sorted(BYTES_PER_WEIGHT)), default="bf16", show_default=True)
@click.option("--kv-dtype", default="bf16", show_default=True, help="KV cache dtype: bf16, fp16, fp8.")
@click.option("--context", "contexts", type=Lengths(), help="Context lengths for the concurrency table, e.g. 8192,32768.")
@click.option("--concurrency", type=click.IntRange(min=1), help="Requests at --context (the first one) to size KV for.")
@click.option("--workload", "workloads", multiple=True, help="A mix CONTEXTxCOUNT, e.g. 8192x16 (repeatable).")
@click.option("--gpu", help="GPU alias from references/gpu-specs.json.")
@click.option("--gpu-total-gib", type=float, help="The GPU's total memory in GiB.")
@click.option("--gpus", type=click.IntRange(min=1), help="GPUs available (the largest TP tried).")
@click.option("--tp", type=click.IntRange(min=1), help="Tensor-parallel size to plan for (default --gpus or 1).")
@click.option("--framework", type=click.Choice(("sglang", "vllm")), default="sglang", show_default=True)
@click.option("--fraction", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              help="mem_fraction_static / gpu_memory_utilization (default 0.9).")
@click.option("--headroom", type=click.FloatRange(0, 0.9), default=0.15, show_default=True,
              help="Share of usable memory kept free (the worksheet's 10–20%).")
@click.option("--training", type=click.Choice(("full", "lora")), help="Size a fine-tuning run instead of serving.")
@click.option("--from-log", type=click.Path(dir_okay=False), help="Fill the worksheet from a start-up log and compare.")
@click.option("--format", "fmt", type=click.Choice(("text", "markdown", "json")), default="text", show_default=True)
@click.option("--output", "-o", type=click.Path(dir_okay=False))
def plan_command(config_json, params, weight_dtype, kv_dtype, contexts, concurrency, workloads, gpu, gpu_total_gib, gpus,
                 tp, framework, fraction, headroom, training, from_log, fmt, output):
    """The pre-deploy worksheet: will the model fit, at which TP, with how many requests."""
    analysis = None
    if from_log:
        analysis = analyse(from_log, gpu=gpu, gpu_total_gib=gpu_total_gib, config_json=config_json)
        request = request_from_log(analysis, parse_params(params))
    else:
        mixes = tuple(parse_workload(w) for w in workloads)
        if concurrency:
            if not contexts:
                raise InputError("--concurrency needs --context")
            mixes += ((contexts[0], concurrency),)
        request = F.PlanRequest(evidence=F.Evidence(F.INPUT_LINE, "capdiag plan", 0, "input"),
                                params=parse_params(params), weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                                workloads=mixes, contexts=tuple(contexts or ()), gpus=gpus, tp=tp, framework=framework,
                                fraction=fraction, headroom=headroom, training=training)
    if request.params is None and not config_json:
        raise InputError("give --params or --config-json")
    report = plan(request, config_json=config_json, gpu=gpu, gpu_total_gib=gpu_total_gib)
    if analysis is not None:
        report["from_log"] = {"path": from_log, "comparison": compare_with_log(report, analysis)}
    _write(render_plan(report, fmt), output)


@main.command("diff")
@click.argument("before")
@click.argument("after")
@click.option("--format", "fmt", type=click.Choice(("text", "markdown", "json")), default="text", show_default=True)
@click.option("--output", "-o", type=click.Path(dir_okay=False))
@click.option("--target-rank", help="Rank to compare (as for explain). Default TP0.")
@click.option("--gpu", help="GPU alias from references/gpu-specs.json (both logs).")
@click.option("--gpu-total-gib", type=float)
@click.option("--config-json", type=click.Path(dir_okay=False))
def diff_command(before, after, fmt, output, target_rank, gpu, gpu_total_gib, config_json):
    """Compare two start-ups: configuration, memory per category, capacity, findings."""
    options = {"target_rank": target_rank, "gpu": gpu, "gpu_total_gib": gpu_total_gib, "config_json": config_json}
    report = diff(analyse(before, **options), analyse(after, **options))
    _write(render_diff(report, fmt), output)


@main.command()
@click.argument("name", required=False)
@click.option("--markdown", is_flag=True, help="Print the documentation of every rule as markdown (docs/rules.md).")
def rules(name, markdown):
    """List the finding rules, or print one rule's documentation (by name or code)."""
    if markdown:
        click.echo(ruledocs.markdown(), nl=False)
    elif name:
        found = find_rule(name)
        if found is None:
            raise InputError(f"no rule named {name!r}; `capdiag rules` lists them")
        click.echo(ruledocs.one(found), nl=False)
    else:
        click.echo(ruledocs.listing(), nl=False)


@main.command()
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True)
@click.pass_context
def example(ctx, fmt):
    """Explain the example log shipped with capdiag (Llama-3.1-8B on one H100)."""
    path = resources.files("capdiag").joinpath("examples", EXAMPLE_LOG)
    with resources.as_file(path) as log:
        ctx.invoke(explain, log=str(log), fmt=fmt, gpu="h100_sxm")


@main.command()
@click.argument("log")
@click.option("--format", "fmt", type=click.Choice(("text", "json")), default="text", show_default=True)
def facts(log, fmt):
    """List every typed fact read from LOG, with its launch and line."""
    found, _, _ = read_log(log)
    launches = split_launches(found)
    rows = [(launch.index, fact) for launch in launches for fact in launch.facts]
    if fmt == "json":
        out = [{"kind": f.kind, "launch": n, "line": f.evidence.line, "rank": attrs.asdict(f.rank),
                "role": f.role, "values": _values(f), "text": f.evidence.text} for n, f in rows]
        click.echo(json.dumps(out, indent=2, ensure_ascii=False, default=str))
        return
    for n, f in rows:
        values = ", ".join(f"{k}={v!r}" for k, v in _values(f).items() if v not in (None, {}, ()))
        click.echo(f"L{n} line {f.evidence.line:>6}  {f.rank.label:<14} {f.role:<6} {f.kind}: {values}"[:400])


def _values(fact) -> dict:
    skip = {"evidence", "rank", "role", "role_stated"}
    values = {k: v for k, v in attrs.asdict(fact, recurse=False).items() if k not in skip}
    if "fields" in values:
        values["fields"] = f"<{len(values['fields'])} fields>"
    return values


def run() -> None:
    """Entry point: input problems become one line on stderr and exit code 2."""
    try:
        main(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"capdiag: error: {exc.format_message()}", err=True)
        sys.exit(2)
    except InputError as exc:
        click.echo(f"capdiag: error: {exc}", err=True)
        sys.exit(2)
