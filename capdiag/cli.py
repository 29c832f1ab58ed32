"""Command line: click wiring over capdiag.api (the same calls a notebook makes); no analysis here."""
from __future__ import annotations

import functools
import itertools
import json
import os
import stat
import sys
import tempfile
import traceback
from typing import Iterable, Optional, Union

import attrs
import click

from capdiag import __version__, api, ruledocs, terminal
from capdiag.analysis import read_launches
from capdiag.api import DEFAULT_FAIL_ON
from capdiag.errors import FROM_CLI, InputError, ReaderGone, output_failed, reader_gone
from capdiag.render import FORMATS, MANY_FORMATS, render_many_pieces
from capdiag.gating import baseline_document
from capdiag.gate_render import GATE_FORMATS, summary_markdown
from capdiag.policy import SEVERITIES, load_policy
from capdiag.printable import printable, printable_data
from capdiag.source import PathArg
from capdiag.rows import Rows, iterencode, pieces
from capdiag.rules.plan.rules import BYTES_PER_WEIGHT
from capdiag.terminal import COLOR_CHOICES
from capdiag.arguments import click_type
from capdiag.vocabulary import DEFAULT_TOKEN_LENGTHS
from capdiag.whatif import KEYS
from capdiag.rules import find_any_rule

EXAMPLE_LOG = "sglang-llama31-8b-h100.log"


def _write(text: Union[str, Iterable[str]], output: Optional[str], color: bool = False) -> None:
    """The output (a string, or its pieces in order) to stdout, or to `output` atomically:
    written beside it and renamed over it, so a full disk or a size limit leaves the old file
    whole instead of a truncated one. No control character reaches either (the renderers
    already made the input's text printable; this is the last check), but the colours of a
    text report asked for."""
    pieces = [text] if isinstance(text, str) else text
    if not output:
        if sys.stdout is None:
            raise InputError("standard output is closed; give --output FILE")
        try:
            for piece in pieces:  # colour asked for is kept, even into a pipe
                click.echo(piece if color else printable(piece), nl=False, color=color or None)
        except BrokenPipeError:
            raise ReaderGone() from None
        return
    target = os.path.realpath(output)  # through a symlink: the file it names is the one replaced
    temp = None
    try:
        if os.path.exists(target) and not stat.S_ISREG(os.stat(target).st_mode):
            # a device, FIFO or socket (/dev/null, /dev/stdout, a pipe) is written in place:
            # renaming over it would leave a regular file where it was (as root, in /dev)
            fh = open(target, "w", encoding="utf-8")
        else:
            fd, temp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp",
                                        dir=os.path.dirname(target))
            fh = os.fdopen(fd, "w", encoding="utf-8")
        with fh:
            for piece in pieces:
                fh.write(printable(piece))
        if temp is not None:
            # the mode a new file gets from the umask (mkstemp makes it 0600), or the old file's
            os.chmod(temp, os.stat(target).st_mode & 0o7777 if os.path.exists(target) else 0o666 & ~_umask())
            os.replace(temp, target)
    except BaseException as exc:  # the pieces are made as they are written: no half report is left
        if temp is not None and os.path.exists(temp):
            os.unlink(temp)
        if isinstance(exc, OSError):
            raise InputError(f"{output}: cannot be written ({exc.strerror or exc})") from None
        raise


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it: set it straight back
    os.umask(mask)
    return mask


CONTEXT = {"help_option_names": ["-h", "--help"]}


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, prog_name="capdiag")
def main() -> None:
    """Explains where an LLM server's GPU memory went, from its start-up log."""
    said = FROM_CLI.set(True)  # errors name the options as flags, until the command ends
    click.get_current_context().call_on_close(lambda: FROM_CLI.reset(said))


# ---- the inputs every command that reads logs shares -------------------------------------------

INPUT_OPTIONS = (
    click.option("--target-rank", help="Rank to break down: a TP index (3) or tags (tp3, pp1, dp2, pp1,tp0). "
                 "Default TP0."),
    click.option("--launch", type=click_type("launch"),
                 help="Which start-up in the file (default: the last that got furthest)."),
    click.option("--what-if", "what_if", multiple=True, metavar="KEY=VALUE",
                 help="Project the start-up under a changed setting (repeatable): " + ", ".join(KEYS) + "."),
    click.option("--token-lengths", type=click_type("token-lengths"), default=",".join(map(str, DEFAULT_TOKEN_LENGTHS)), show_default=True,
                 help="Request lengths (tokens) for the concurrency table."),
    click.option("--gpu", help="GPU alias from references/gpu-specs.json (e.g. h100_sxm, h200, a100_80gb_sxm)."),
    click.option("--gpu-total-gib", type=float, help="The GPU's total memory in GiB (beats --gpu's reference figure)."),
    click.option("--framework", type=click.Choice(("sglang", "vllm")), help="Skip detection: the log is this framework's."),
    click.option("--nvidia-smi-file", type=click.Path(dir_okay=False),
                 help="nvidia-smi output: `--query-gpu=index,memory.used,memory.free --format=csv[,noheader]` "
                      "or the table."),
    click.option("--config-json", type=click.Path(dir_okay=False),
                 help="The model's config.json (theoretical KV bytes per token, expected weights)."),
    click.option("--no-runtime", is_flag=True,
                 help="Skip the run-time section: do not read the request-time traffic lines (faster on long logs)."),
    click.option("--until-ready/--to-end", "until_ready", default=None,
                 help="Report as soon as the start-up is ready or failed and the stream pauses, without waiting "
                      "for it to close (default for a pipe), or read to the end."),
)


def log_inputs(func):
    """The shared input options, handed to the command as one `inputs` dict (capdiag.api's
    keyword arguments)."""
    @functools.wraps(func)
    def command(*args, target_rank, launch, what_if, token_lengths, gpu, gpu_total_gib, framework, nvidia_smi_file,
                config_json, no_runtime, until_ready, **kwargs):
        inputs = {"target_rank": target_rank, "launch": launch, "what_if": what_if, "token_lengths": token_lengths,
                  "gpu": gpu, "gpu_total_gib": gpu_total_gib, "framework": framework, "nvidia_smi": nvidia_smi_file,
                  "config_json": config_json, "until_ready": until_ready, "runtime": not no_runtime}
        return func(*args, inputs=inputs, **kwargs)

    for option in reversed(INPUT_OPTIONS):
        command = option(command)
    return command


def _stdin_or_refuse(logs: tuple[str, ...]) -> tuple[str, ...]:
    """The logs named (each a path, whatever its name holds), else standard input when it is a
    pipe or a file."""
    if logs:
        return tuple(PathArg(log) for log in logs)
    if sys.stdin is None or sys.stdin.isatty():
        raise InputError("give a LOG (a path, a directory of logs, or - for standard input), or pipe one in")
    return ("-",)


# ---- explain -------------------------------------------------------------------------------

@main.command(context_settings=CONTEXT)
@click.argument("logs", nargs=-1, metavar="[LOG|DIR]...")
@click.option("--format", "fmt", type=click.Choice(FORMATS + MANY_FORMATS), default="text", show_default=True,
              help="One report; or, for many logs, one row (table, csv) or report (jsonl) per log; text is the table "
                   "for many.")
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Write the report here instead of stdout.")
@log_inputs
@click.option("--trace", "trace", multiple=True, is_flag=False, flag_value="", metavar="[RULE,…]",
              help="Print the engine's firings (each rule's inputs and value) to stderr; with rule names, codes or "
                   "patterns (breakdown.*), only theirs, and why each did not fire.")
@click.option("--color", type=click.Choice(COLOR_CHOICES), default="auto", show_default=True,
              help="Colour the text report's bars and severities (auto: a terminal, and NO_COLOR unset).")
@click.option("--no-color", is_flag=True, help="The same as --color never.")
@click.option("--jobs", "-j", type=click_type("jobs"), help="Worker processes for many logs (default: one per core).")
def explain(logs, fmt, output, inputs, trace, color, no_color, jobs):
    """Explain where each GPU's memory went in LOG (a path, - or a pipe for stdin, a .gz file, or a
    running server's URL: see `probe`); with several logs or a directory (its *.log and *.log.gz),
    one row or report per log."""
    logs = _stdin_or_refuse(logs)
    if fmt in MANY_FORMATS or len(logs) > 1 or os.path.isdir(logs[0]):
        _explain_many(logs, fmt, output, inputs, trace, jobs)
        return
    report = api.probe(logs[0], progress=terminal.progress_line(), **inputs) if api.is_url(logs[0]) \
        else api.explain(logs[0], **inputs)
    if trace:
        wanted = tuple(name.strip() for item in trace for name in item.split(",") if name.strip())
        _echo_err(report.trace(wanted, width=terminal.width(sys.stderr)))
    colored = fmt == "text" and not output and terminal.use_color("never" if no_color else color)
    _write(report.render_pieces(fmt, color=colored, width=terminal.width() if not output else None), output, colored)


def _explain_many(logs, fmt, output, inputs, trace, jobs):
    """Many logs: their table, CSV or JSON lines in input order; exit 2 when one could not be read."""
    if trace:
        raise InputError("--trace follows one log; give just that one")
    if fmt not in MANY_FORMATS + ("text",):
        raise InputError(f"--format {fmt} is one report; for many logs use {', '.join(MANY_FORMATS)}")
    from capdiag import batch  # worker processes: only for many logs

    errors: list[str] = []

    def noted(items):  # each written as it is done; only the errors are kept, for the end
        for item in items:
            if item.error:
                errors.append(item.error)
            yield item
    _write(render_many_pieces(noted(batch.explain_many(logs, api.report_of, jobs=jobs, **inputs)),
                              "table" if fmt == "text" else fmt), output)
    for error in errors:
        click.echo(f"capdiag: error: {printable(error)}", err=True)
    if errors:
        sys.exit(2)


def _echo_err(text: str) -> None:
    click.echo(printable(text), err=True, nl=False)


# ---- probe ---------------------------------------------------------------------------------

@main.command("probe", context_settings=CONTEXT)
@click.argument("url", required=False)
@click.option("--metrics-file", "metrics_files", multiple=True, type=click.Path(dir_okay=False),
              help="A saved scrape of /metrics instead of a URL (repeat, oldest first, for a series).")
@click.option("--header", "headers", multiple=True, metavar="'NAME: VALUE'", help="An extra HTTP header (repeatable).")
@click.option("--token-env", metavar="VAR", help="Send `Authorization: Bearer $VAR` (the token stays out of the command line).")
@click.option("--timeout", type=click_type("timeout"), default=10.0, show_default=True, help="Seconds per request.")
@click.option("--insecure", is_flag=True, help="Do not verify the server's TLS certificate.")
@click.option("--ca-cert", type=click.Path(dir_okay=False, exists=True), help="Verify TLS against this CA bundle.")
@click.option("--framework", type=click.Choice(("sglang", "vllm")), help="Skip detection: the server is this framework.")
@click.option("--interval", type=click_type("interval"), metavar="S",
              help="Seconds between the two reads of a server's load and /metrics, for its rates (default 5; 0 reads "
                   "once); with --metrics-file, the seconds between the saved scrapes when they carry no time.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True)
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Write the report here instead of stdout.")
@click.option("--gpu", help="GPU alias from references/gpu-specs.json.")
@click.option("--gpu-total-gib", type=float, help="The GPU's total memory in GiB.")
@click.option("--token-lengths", type=click_type("token-lengths"), default=",".join(map(str, DEFAULT_TOKEN_LENGTHS)), show_default=True)
def probe_command(url, metrics_files, headers, token_env, timeout, insecure, ca_cert, fmt, output, **inputs):
    """Explain a running server from its own endpoints (SGLang /server_info, /v1/loads; vLLM /metrics,
    /v1/models, /version), or from saved scrapes of its /metrics."""
    report = api.probe(url, metrics_files=metrics_files, headers=headers, token_env=token_env, timeout=timeout,
                       verify=False if insecure else (ca_cert or True), progress=terminal.progress_line(), **inputs)
    _write(report.render_pieces(fmt, width=terminal.width() if not output else None), output)


# ---- gate and baseline -----------------------------------------------------------------------

def _gate_options(func):
    """The policy and deployment name, and the inputs `gate` and `baseline` share with `explain`."""
    @functools.wraps(func)
    def call(*args, no_policy: bool = False, policy=None, **kwargs):
        return func(*args, policy=False if no_policy else policy, **kwargs)
    call = log_inputs(call)
    call = click.option("--deployment", help="Name the deployment the logs come from (part of every fingerprint; "
                                             "beats the policy's `deployment`).")(call)
    call = click.option("--no-policy", is_flag=True, help="Use no policy, not even one found from the working "
                                                         "directory.")(call)
    return click.option("--policy", type=click.Path(dir_okay=False),
                        help="A capdiag.toml policy (or a pyproject.toml with [tool.capdiag]); default: the nearest "
                             "one in the working directory or a parent.")(call)


@main.command("gate", context_settings=CONTEXT)
@click.argument("logs", nargs=-1, required=True)
@_gate_options
@click.option("--fail-on", type=click.Choice(SEVERITIES), help=f"Lowest severity that fails (default: the policy's, "
              f"else {DEFAULT_FAIL_ON}).")
@click.option("--format", "fmt", type=click.Choice(GATE_FORMATS), default="text", show_default=True)
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Write the report here instead of stdout.")
@click.option("--baseline", type=click.Path(dir_okay=False), help="Accept the findings this baseline lists.")
@click.option("--repo-root", "--sarif-root", "repo_root", type=click.Path(file_okay=False),
              help="Make the log paths in SARIF, GitLab and GitHub output relative to this repository root.")
@click.option("--fail-on-unknown", is_flag=True,
              help="A rule at or above --fail-on that could not judge (its inputs are unknown) fails the gate too.")
@click.option("--exit-zero", is_flag=True, help="Report, but exit 0 even when the gate fails (input errors still exit 2).")
def gate_command(logs, policy, deployment, inputs, fail_on, fmt, output, baseline, repo_root, fail_on_unknown,
                 exit_zero):
    """Gate a deploy on the start-up logs: exit 0 pass, 1 a finding at or above --fail-on, 2 input error."""
    result = api.gate(_stdin_or_refuse(logs), fail_on=fail_on, policy=policy, baseline=baseline, deployment=deployment,
                      fail_on_unknown=fail_on_unknown, **inputs)
    _write(result.render(fmt, repo_root), output)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if fmt == "github" and summary:
        try:
            with open(summary, "a", encoding="utf-8") as fh:
                fh.write(summary_markdown(result.verdict))
        except OSError as exc:
            raise InputError(f"GITHUB_STEP_SUMMARY {summary}: cannot be written ({exc.strerror})") from None
    sys.exit(result.exit_code(exit_zero))


@main.command("check-policy", context_settings=CONTEXT)
@click.argument("policies", nargs=-1, required=True, type=click.Path(dir_okay=False))
def check_policy(policies):
    """Validate capdiag.toml policies (the pre-commit hook): exit 2 naming the first mistake of each."""
    bad = 0
    for path in policies:
        try:
            loaded = load_policy(path)
        except InputError as exc:
            click.echo(f"capdiag: error: {printable(str(exc))}", err=True)
            bad += 1
            continue
        click.echo(printable(f"{path}: ok ({len(loaded.rules)} rule setting(s), fail-on {loaded.fail_on or DEFAULT_FAIL_ON})"))
    if bad:
        sys.exit(2)


@main.command("baseline", context_settings=CONTEXT)
@click.argument("logs", nargs=-1, required=True)
@_gate_options
@click.option("--output", "-o", type=click.Path(dir_okay=False), required=True, help="The baseline file to write.")
@click.option("--reason", help="Why these findings are accepted (kept in each entry, shown when one is refused).")
@click.option("--expires", metavar="YYYY-MM-DD", help="After this date the entries accept nothing.")
def baseline_command(logs, policy, deployment, inputs, output, reason, expires):
    """Write a baseline that accepts every finding the logs raise now, as bad as it is now."""
    verdict = api.gate(_stdin_or_refuse(logs), policy=policy, deployment=deployment, **inputs).verdict
    if verdict.errors:
        raise InputError(verdict.errors[0].error)
    document = baseline_document(verdict, reason=reason, expires=expires)
    _write(json.dumps(printable_data(document), indent=2, ensure_ascii=False) + "\n", output)
    click.echo(printable(f"capdiag: wrote {len(document['entries'])} baseline entries to {output}"), err=True)


@main.command("plan", context_settings=CONTEXT)
@click.option("--config-json", type=click.Path(dir_okay=False), help="The model's config.json (shape, parameters).")
@click.option("--model", metavar="ORG/NAME", help="A Hugging Face model id: its config.json (and exact weight bytes) "
              "through huggingface_hub (its cache, HF_TOKEN, HF_HUB_OFFLINE).")
@click.option("--params", help="Parameter count: 70B, 7.5B or 7e10 (instead of counting from config.json).")
@click.option("--layers", type=click_type("layers"), help="Without a config.json: layers holding KV.")
@click.option("--kv-heads", type=click_type("kv-heads"), help="Without a config.json: KV heads.")
@click.option("--head-dim", type=click_type("head-dim"), help="Without a config.json: the head dimension.")
@click.option("--hidden", type=click_type("hidden"), help="Without a config.json: hidden size (activation estimate).")
@click.option("--weight-dtype", type=click.Choice(sorted(BYTES_PER_WEIGHT)),
              help="The checkpoint's weight format where config.json states none (default: as config.json or "
                   "--from-log states it).")
@click.option("--kv-dtype", help="KV cache dtype: bf16, fp16, fp8, auto (default: as --from-log states, else auto: "
              "the model's dtype).")
@click.option("--context", "contexts", type=click_type("context"), help="Context lengths for the concurrency table, e.g. 8192,32768.")
@click.option("--concurrency", type=click_type("concurrency"), help="Requests at --context (the first one) to size KV for.")
@click.option("--workload", "workloads", multiple=True, help="A mix CONTEXTxCOUNT, e.g. 8192x16 (repeatable).")
@click.option("--gpu", help="GPU alias from references/gpu-specs.json.")
@click.option("--gpu-total-gib", type=float, help="The GPU's total memory in GiB.")
@click.option("--gpus", type=click_type("gpus"), help="GPUs available (the largest TP tried).")
@click.option("--tp", type=click_type("tp"), help="Tensor-parallel size to plan for (default --gpus or 1).")
@click.option("--framework", type=click.Choice(("sglang", "vllm")), help="sglang (default) or vllm.")
@click.option("--fraction", type=click_type("fraction"),
              help="mem_fraction_static / gpu_memory_utilization (default: the framework's own: SGLang computes it "
                   "from the GPU, vLLM takes 0.9).")
@click.option("--framework-version", help="The release to plan for, e.g. 0.10.1 (default: the newest modelled).")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
              help="A framework setting (the keys --what-if takes: max_num_seqs, max_running_requests, "
                   "max_num_batched_tokens, chunked_prefill_size, page_size, block_size, enforce_eager, …).")
@click.option("--headroom", type=click_type("headroom"), default=0.15, show_default=True,
              help="With --training: the share of the GPU kept for activations.")
@click.option("--training", type=click.Choice(("full", "lora")), help="Size a fine-tuning run instead of serving.")
@click.option("--from-log", type=click.Path(dir_okay=False), help="Fill the worksheet from a start-up log and compare.")
@click.option("--format", "fmt", type=click.Choice(("text", "markdown", "json")), default="text", show_default=True)
@click.option("--output", "-o", type=click.Path(dir_okay=False))
def plan_command(fmt, output, **options):
    """The pre-deploy worksheet: will the model fit, at which TP, with how many requests."""
    _write(api.plan(**options).render(fmt), output)


@main.command("diff", context_settings=CONTEXT)
@click.argument("before")
@click.argument("after")
@click.option("--format", "fmt", type=click.Choice(("text", "markdown", "json")), default="text", show_default=True)
@click.option("--output", "-o", type=click.Path(dir_okay=False))
@log_inputs
def diff_command(before, after, fmt, output, inputs):
    """Compare two start-ups: configuration, memory per category, capacity, findings."""
    _write(api.diff(PathArg(before), PathArg(after), **inputs).render(fmt, width=terminal.width() if not output else None), output)


@main.command(context_settings=CONTEXT)
@click.argument("name", required=False)
@click.option("--derivations", is_flag=True,
              help="List the rules that derive values (breakdown, KV pool, configuration, what-if, plan, diff), "
                   "with their kind.")
@click.option("--markdown", is_flag=True, help="Print the documentation of every rule as markdown (docs/rules.md).")
def rules(name, derivations, markdown):
    """List the finding rules, or print one rule's documentation (a finding by name or code, a
    derivation rule by name)."""
    if markdown:
        _write(ruledocs.markdown(), None)
    elif name:
        found = find_any_rule(name)
        if found is None:
            raise InputError(f"no rule named {name!r}; `capdiag rules` and `capdiag rules --derivations` list them")
        _write(ruledocs.one(found), None)
    elif derivations:
        _write(ruledocs.derivation_listing(), None)
    else:
        _write(ruledocs.listing(), None)


@main.command(context_settings=CONTEXT)
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True)
@click.pass_context
def example(ctx, fmt):
    """Explain the example log shipped with capdiag (Llama-3.1-8B on one H100)."""
    from importlib import resources  # only this command reads a file shipped in the package

    path = resources.files("capdiag").joinpath("examples", EXAMPLE_LOG)
    with resources.as_file(path) as log:
        ctx.invoke(explain, logs=(str(log),), fmt=fmt, gpu="h100_sxm")


@main.command(context_settings=CONTEXT)
@click.argument("log", required=False)
@click.option("--format", "fmt", type=click.Choice(("text", "json")), default="text", show_default=True)
def facts(log, fmt):
    """List every typed fact read from LOG (or a pipe on stdin), with its launch and line."""
    launches = read_launches(_stdin_or_refuse((log,) if log else ())[0], keep_all=True).launches
    rows = [(launch.index, fact) for launch in launches for fact in launch.facts]
    if fmt == "json":
        # each fact's entry made printable before it is encoded (a DEL or C1 character json.dumps
        # leaves as it is would become a `\x7f` that no JSON reader takes), and made as it is
        # written (capdiag.rows): 100,000 facts' entries are never all held
        def entry(row: tuple) -> dict:
            n, f = row
            return printable_data({"kind": f.kind, "launch": n, "line": f.evidence.line, "rank": attrs.asdict(f.rank),
                                   "role": f.role, "values": _jsonable(_values(f)), "text": f.evidence.text})

        _write(itertools.chain(pieces(iterencode(Rows(rows, entry))), ["\n"]), None)
        return
    listing = []
    for n, f in rows:
        values = ", ".join(f"{k}={v!r}" for k, v in _values(f).items() if v not in (None, {}, ()))
        listing.append(f"L{n} line {f.evidence.line:>6}  {f.rank.label:<14} {f.role:<6} {f.kind}: {values}"[:400] + "\n")
    _write("".join(listing), None)


def _jsonable(value):
    """`value` with whatever JSON has no type for (a parsed call, an elision) as its text."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


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


def run() -> None:
    """Entry point: input problems become one line on stderr and exit code 2; a reader that
    went away (a closed pipe) ends the run quietly; an output that cannot be written is an error.
    A console whose encoding lacks a character the report uses (cp1252, latin-1: `→`, `…`, `≈`)
    gets `?` in its place, never a UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")
    stdout = sys.stdout
    try:
        main(standalone_mode=False)
        if sys.stdout is not None:
            sys.stdout.flush()
    except SystemExit as exc:
        # click writes --help itself, and on a broken pipe swaps in a quiet stdout and exits 1:
        # a gate's own exit 1 leaves stdout as it was
        if exc.code == 1 and sys.stdout is not stdout:
            reader_gone()
        raise
    except click.exceptions.Abort:
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        _fail(exc.format_message())
    except InputError as exc:
        _fail(str(exc))
    except (BrokenPipeError, ReaderGone):
        reader_gone()
    except OSError as exc:  # stdout on a full disk, EIO, …: the report was not delivered
        output_failed(exc)
    except Exception as exc:  # a bug in capdiag: exit 2, as an error, never the 1 a failing gate exits with
        if os.environ.get("CAPDIAG_TRACEBACK"):
            traceback.print_exc()
        _fail(f"internal error ({type(exc).__name__}): capdiag could not finish; this is a bug — please report it "
              "(CAPDIAG_TRACEBACK=1 prints the traceback)")
