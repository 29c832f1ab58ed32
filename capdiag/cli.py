"""Command line: `capdiag explain LOG` and `capdiag facts LOG`. Wiring only."""
from __future__ import annotations

import json
import sys
from importlib import resources
from typing import Optional

import attrs
import click

from capdiag import __version__, ruledocs
from capdiag.analysis import analyse, read_log
from capdiag.errors import InputError
from capdiag.launches import split_launches
from capdiag.render import FORMATS, render, render_trace
from capdiag.report import build
from capdiag.rules import find_rule

EXAMPLE_LOG = "sglang-llama31-8b-h100.log"


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
def explain(log, fmt, output, target_rank, token_lengths, gpu, gpu_total_gib, launch, framework, nvidia_smi_file,
            config_json, trace):
    """Explain where each GPU's memory went in LOG (a path, - for stdin, or a .gz file)."""
    a = analyse(log, launch=launch, target_rank=target_rank, token_lengths=token_lengths, gpu=gpu,
                gpu_total_gib=gpu_total_gib, framework=framework, nvidia_smi=nvidia_smi_file,
                config_json=config_json)
    if trace:
        click.echo(render_trace(a.firings), err=True, nl=False)
    _write(render(build(a), fmt), output)


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
    except click.ClickException as exc:
        click.echo(f"capdiag: error: {exc.format_message()}", err=True)
        sys.exit(2)
    except InputError as exc:
        click.echo(f"capdiag: error: {exc}", err=True)
        sys.exit(2)
