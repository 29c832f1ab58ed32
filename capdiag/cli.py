"""Command line: `capdiag explain LOG` and `capdiag facts LOG`. Wiring only."""
from __future__ import annotations

import json
import os
import sys
import tempfile
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
from capdiag.printable import printable
from capdiag import facts as F
from capdiag.diffing import diff
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


def _write(text: str, output: Optional[str], colored: bool = False) -> None:
    """The output to stdout, or to `output` atomically: written beside it and renamed over it,
    so a full disk or a size limit leaves the old file whole instead of a truncated one. No
    control character reaches either (the renderers already made the input's text printable;
    this is the last check), but the colours of a text report on a terminal."""
    text = text if colored else printable(text)
    if not output:
        if sys.stdout is None:
            raise InputError("standard output is closed; give --output FILE")
        click.echo(text, nl=False)
        return
    target = os.path.abspath(output)
    temp = None
    try:
        fd, temp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp", dir=os.path.dirname(target))
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        if os.path.exists(target):
            os.chmod(temp, os.stat(target).st_mode & 0o7777)
        os.replace(temp, target)
    except OSError as exc:
        if temp is not None and os.path.exists(temp):
            os.unlink(temp)
        raise InputError(f"{output}: cannot be written ({exc.strerror or exc})") from None


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
def explain(log, fmt, output, target_rank, token_lengths, gpu, gpu_total_gib, launch, framework, nvidia_smi_file,
            config_json, trace, what_if, no_color):
    """Explain where each GPU's memory went in LOG (a path, - for stdin, or a .gz file)."""
    a = analyse(log, launch=launch, target_rank=target_rank, token_lengths=token_lengths, gpu=gpu,
                gpu_total_gib=gpu_total_gib, framework=framework, nvidia_smi=nvidia_smi_file,
                config_json=config_json, what_if=parse_what_if(what_if))
    if trace:
        click.echo(printable(render_trace(a.firings)), err=True, nl=False)
    color = (fmt == "text" and not output and not no_color and not os.environ.get("NO_COLOR")
             and sys.stdout is not None and sys.stdout.isatty())
    _write(render(build(a), fmt, color=color), output, colored=color)


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
    click.echo(printable(f"capdiag: wrote {len(document['entries'])} baseline entries to {output}"), err=True)


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
        _write(ruledocs.markdown(), None)
    elif name:
        found = find_rule(name)
        if found is None:
            raise InputError(f"no rule named {name!r}; `capdiag rules` lists them")
        _write(ruledocs.one(found), None)
    else:
        _write(ruledocs.listing(), None)


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
        _write(json.dumps(out, indent=2, ensure_ascii=False, default=str) + "\n", None)
        return
    listing = []
    for n, f in rows:
        values = ", ".join(f"{k}={v!r}" for k, v in _values(f).items() if v not in (None, {}, ()))
        listing.append(f"L{n} line {f.evidence.line:>6}  {f.rank.label:<14} {f.role:<6} {f.kind}: {values}"[:400] + "\n")
    _write("".join(listing), None)


def _values(fact) -> dict:
    skip = {"evidence", "rank", "role", "role_stated"}
    values = {k: v for k, v in attrs.asdict(fact, recurse=False).items() if k not in skip}
    if "fields" in values:
        values["fields"] = f"<{len(values['fields'])} fields>"
    return values


def _fail(message: str) -> None:
    """One line on stderr (input text in it made printable and clipped), exit code 2."""
    message = printable(message).replace("\n", " ")
    click.echo(f"capdiag: error: {message if len(message) <= 400 else message[:399] + '…'}", err=True)
    sys.exit(2)


def _quiet_stdout() -> None:
    """After a failed write to stdout, point it at /dev/null so the interpreter's own flush at
    exit cannot fail again and print a traceback."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def run() -> None:
    """Entry point: input problems become one line on stderr and exit code 2; a reader that
    went away (a closed pipe) ends the run quietly; an output that cannot be written is an error."""
    try:
        main(standalone_mode=False)
        if sys.stdout is not None:
            sys.stdout.flush()
    except click.exceptions.Abort:
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        _fail(exc.format_message())
    except InputError as exc:
        _fail(str(exc))
    except BrokenPipeError:
        _quiet_stdout()
        sys.exit(141)  # the shell's code for a process whose reader closed the pipe (128 + SIGPIPE)
    except OSError as exc:  # stdout on a full disk, EIO, …: the report was not delivered
        _quiet_stdout()
        _fail(f"the output cannot be written ({exc.strerror or exc})")
