"""The Python API: `capdiag.explain`, `gate`, `plan`, `diff` and what they return.

The command line is a thin layer over these functions, so a notebook gets exactly what the
CLI prints. Every problem with the input raises `capdiag.InputError` with the one-line message
the CLI prints (`capdiag: error: <message>`). docs/api.md documents it; its examples run in the
test suite.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, Union

from capdiag import facts as F
from capdiag.analysis import Analysis, analyse
from capdiag.arguments import check, check_lengths
from capdiag.errors import FROM_CLI, InputError, for_python, python_errors
from capdiag.frozen import frozen
from capdiag.rows import plain
from capdiag.source import LogInput
from capdiag.vocabulary import DEFAULT_TOKEN_LENGTHS
from capdiag.whatif import parse_what_if

DEFAULT_FAIL_ON = "warning"
WhatIfInput = Union[Mapping[str, Any], Sequence[str], None]


# The rows a report hands out are dataclasses, so `pandas.DataFrame(report.breakdown)` has a
# column per field, and each has `to_dict()`.
@dataclasses.dataclass(frozen=True)
class _Row:
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class EvidenceLine(_Row):
    """One line a conclusion rests on: where (`line 12`, `nvidia-smi line 3`, `config.json`,
    `input`), its line number (0 for inputs), the input it came from, and its text."""

    where: str
    line: int
    source: str
    text: str
    kind: str


@dataclasses.dataclass(frozen=True)
class Category(_Row):
    """One row of the memory breakdown of the target rank."""

    category: str
    gib: Optional[float]  # None when unknown
    status: str  # measured | derived | unknown
    derivation: str  # the arithmetic, or the reason it is unknown
    rule: str
    evidence: tuple[EvidenceLine, ...]
    parent: Optional[str] = None  # the row this one lies within; None for a top-level row


@dataclasses.dataclass(frozen=True)
class Finding(_Row):
    """A finding with its evidence chain: the conclusions it was drawn from, down to log lines."""

    code: Optional[str]
    name: str
    severity: str  # info | warning | error
    title: str
    message: str
    action: str
    because: tuple[dict, ...]  # the conclusions it rests on: rule, topic, key, rank, value, unknown, formula
    evidence: tuple[EvidenceLine, ...]


def _evidence(rows: Iterable[dict[str, Any]]) -> tuple[EvidenceLine, ...]:
    return tuple(EvidenceLine(e["where"], e["line"], e["source"], e["text"], e["kind"]) for e in rows)


class _Document:
    """A report as data (the documented JSON contract) that renders itself."""

    def __init__(self, data: dict[str, Any]):
        self._data = data

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data (a deep copy: changing it changes nothing here)."""
        return json.loads(self.to_json())

    def to_json(self, indent: Optional[int] = 2) -> str:
        return json.dumps(self._data, indent=indent, ensure_ascii=False, default=plain)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._data.get('schema')}>"


class Report(_Document):
    """What `capdiag explain` reports for one log (docs/report-json.md is the contract)."""

    def __init__(self, data: dict[str, Any], analysis: Optional[Analysis] = None):
        super().__init__(data)
        self._analysis = analysis

    def _repr_html_(self) -> str:
        """How a notebook shows it: the answer, the breakdown and the findings, as an HTML fragment
        (no page, no style sheet: nothing of it leaks into the notebook's own page)."""
        from capdiag.render import render_notebook

        return render_notebook(self._data)

    @property
    def framework(self) -> str:
        return self._data["framework"]

    @property
    def phase(self) -> Optional[str]:
        """The start-up phase the analysed launch reached (`ready` when it finished)."""
        return self._data["source"]["phase_reached"]

    @property
    def breakdown(self) -> tuple[Category, ...]:
        return tuple(Category(r["category"], r["gib"], r["status"], r["derivation"], r["rule"],
                              _evidence(r["evidence"]), r["parent"]) for r in self._data["breakdown"])

    @property
    def findings(self) -> tuple[Finding, ...]:
        return tuple(Finding(f["code"], f["name"], f["severity"], f["title"], f["message"], f["action"],
                             tuple(f["because"]), _evidence(f["evidence"])) for f in self._data["findings"])

    @property
    def concurrency(self) -> tuple[dict, ...]:
        return tuple(self._data["concurrency"])

    @python_errors
    def render(self, fmt: str = "text", *, color: bool = False, width: Optional[int] = None) -> str:
        """The report as `text` (wrapped to `width`, default 100 columns), `markdown`, `html` or `json`."""
        return "".join(self.render_pieces(fmt, color=color, width=width))

    @python_errors
    def render_pieces(self, fmt: str = "text", *, color: bool = False, width: Optional[int] = None) -> Iterator[str]:
        """render() a piece at a time, to be written as it goes (a JSON report is never held whole)."""
        from capdiag.render import FORMATS, render_pieces
        from capdiag.terminal import DEFAULT_WIDTH

        if fmt not in FORMATS:
            raise InputError(f"--format {fmt}: one of {', '.join(FORMATS)}")
        return render_pieces(self._data, fmt, color=color, width=width or DEFAULT_WIDTH)

    @python_errors
    def trace(self, rules: Sequence[str] = (), *, width: Optional[int] = None) -> str:
        """The engine's firings (each rule's inputs and value), for `rules` (names, codes or
        patterns like `breakdown.*`; all when empty), and why each of those did not fire."""
        from capdiag.render import render_trace
        from capdiag.report import rule_wanted, trace_rows
        from capdiag.rules import rules_for
        from capdiag.terminal import DEFAULT_WIDTH

        if self._analysis is None:
            raise InputError("this report was not made by capdiag.explain; there is nothing to trace")
        candidates = rules_for(self._analysis.framework, every=True)
        for wanted in rules:
            if not any(rule_wanted(r, (wanted,)) for r in candidates):
                raise InputError(f"--trace {wanted}: no rule of this {self.framework} analysis is called that; "
                                 "`capdiag rules` lists the finding rules")
        rows = trace_rows(self._analysis.firings, candidates, self._analysis.knowledge, tuple(rules))
        return render_trace(rows, width or DEFAULT_WIDTH)


def _what_if(what_if: WhatIfInput) -> Optional[F.WhatIf]:
    if what_if is None:
        return None
    items = [f"{k}={v}" for k, v in what_if.items()] if isinstance(what_if, Mapping) else list(what_if)
    return parse_what_if(tuple(items))


def analyse_options(*, gpu=None, gpu_total_gib=None, nvidia_smi=None, config_json=None, framework=None,
                    target_rank=None, launch=None, token_lengths=DEFAULT_TOKEN_LENGTHS, what_if: WhatIfInput = None,
                    until_ready=None, runtime=True) -> dict[str, Any]:
    """The API's keyword arguments as analysis.analyse() takes them."""
    return {"launch": check("launch", launch), "target_rank": None if target_rank is None else str(target_rank),
            "token_lengths": check_lengths("token-lengths", token_lengths), "gpu": gpu, "gpu_total_gib": gpu_total_gib,
            "framework": framework, "nvidia_smi": nvidia_smi, "config_json": config_json,
            "what_if": _what_if(what_if), "until_ready": until_ready, "runtime": runtime}


def _analysis(log: LogInput, **inputs: Any) -> Analysis:
    return analyse(log, **analyse_options(**inputs))


@python_errors
def explain(log: LogInput, *, gpu: Optional[str] = None, gpu_total_gib: Optional[float] = None,
            nvidia_smi: Optional[str] = None, config_json: Optional[str] = None, framework: Optional[str] = None,
            target_rank: Union[str, int, None] = None, launch: Optional[int] = None,
            token_lengths: Sequence[int] = DEFAULT_TOKEN_LENGTHS, what_if: WhatIfInput = None,
            until_ready: Optional[bool] = None, runtime: bool = True) -> Report:
    """Explain where each GPU's memory went in one start-up log.

    `log` is a path (`-` for stdin, `.gz` read as such), the log's text (a str holding a
    newline), bytes, a file object (text or binary) or an iterable of lines. `nvidia_smi` and
    `config_json` are paths; `what_if` is `{"mem_fraction_static": 0.88}` or `["KEY=VALUE"]`;
    `runtime=False` skips the request-time traffic lines (the report's `runtime` is then None).
    """
    from capdiag.report import build

    a = _analysis(log, gpu=gpu, gpu_total_gib=gpu_total_gib, nvidia_smi=nvidia_smi, config_json=config_json,
                  framework=framework, target_rank=target_rank, launch=launch, token_lengths=token_lengths,
                  what_if=what_if, until_ready=until_ready, runtime=runtime)
    return Report(build(a), a)


def is_url(log: Any) -> bool:
    return isinstance(log, str) and log.startswith(("http://", "https://"))


@python_errors
def probe(url: Optional[str] = None, *, metrics_files: Sequence[str] = (), headers: Sequence[str] = (),
          token_env: Optional[str] = None, timeout: float = 10.0, verify: Union[bool, str] = True,
          framework: Optional[str] = None, gpu: Optional[str] = None, gpu_total_gib: Optional[float] = None,
          token_lengths: Sequence[int] = DEFAULT_TOKEN_LENGTHS, target_rank: Union[str, int, None] = None,
          what_if: WhatIfInput = None, interval: Optional[float] = None,
          progress: Optional[Callable[[str], None]] = None, **_log_only: Any) -> Report:
    """The report of a running server, from its own endpoints (`url`), or of saved scrapes of its
    `/metrics` (`metrics_files`, oldest first). A server's load and metrics are read twice,
    `interval` seconds apart (default 5, 0 once) for its rates; for saved scrapes `interval` is
    the seconds between them when they carry no time; `progress`, when given, is called with a
    line to show while the probe waits, and with "" when the wait ends. Options that only a log
    has (`launch`, `nvidia_smi`, …) are ignored."""
    from capdiag.probe import analyse_probe
    from capdiag.report import build

    a = analyse_probe(url, tuple(metrics_files), framework=framework, headers=tuple(headers), token_env=token_env,
                      timeout=check("timeout", timeout), verify=verify, gpu=gpu, gpu_total_gib=gpu_total_gib,
                      token_lengths=check_lengths("token-lengths", token_lengths), target_rank=None if target_rank is None else str(target_rank),
                      what_if=_what_if(what_if), interval=check("interval", interval), progress=progress)
    return Report(build(a), a)


class GateResult:
    """A gate verdict over one or more logs: `status` pass | fail | error and the exit code."""

    def __init__(self, verdict):
        self.verdict = verdict

    @property
    def status(self) -> str:
        return self.verdict.status

    def exit_code(self, exit_zero: bool = False) -> int:
        return self.verdict.exit_code(exit_zero)

    def to_dict(self) -> dict[str, Any]:
        return json.loads(self.render("json"))

    @python_errors
    def render(self, fmt: str = "text", repo_root: Optional[str] = None) -> str:
        """One of gate_render.GATE_FORMATS (text, json, sarif, junit, github, …); `repo_root`
        makes the log paths in SARIF, GitLab and GitHub output relative to it."""
        from capdiag.gate_render import GATE_FORMATS, render_gate

        if fmt not in GATE_FORMATS:
            raise InputError(f"--format {fmt}: one of {', '.join(GATE_FORMATS)}")
        return render_gate(self.verdict, fmt, repo_root)

    def __repr__(self) -> str:
        return f"<GateResult {self.status}>"


@python_errors
def gate(logs: Sequence[LogInput], *, fail_on: Optional[str] = None, policy: Union[str, bool, None] = None,
         baseline: Optional[str] = None, deployment: Optional[str] = None, fail_on_unknown: bool = False,
         **inputs: Any) -> GateResult:
    """Gate a deploy on start-up logs: fails on a finding at or above `fail_on` (default: the
    policy's, else warning) that the baseline does not accept, and with `fail_on_unknown` (or
    the policy's) on a rule at that level that could not judge. `policy` is a policy file; by
    default the nearest `capdiag.toml` (or `pyproject.toml` with `[tool.capdiag]`) from the
    working directory up; False for none. `deployment` names the deployment (part of every
    fingerprint; beats the policy's). `inputs` as for explain()."""
    from capdiag import gating
    from capdiag.policy import SEVERITIES, find_policy, load_policy

    if fail_on is not None and fail_on not in SEVERITIES:
        raise InputError(f"--fail-on {fail_on}: one of {', '.join(SEVERITIES)}")
    if isinstance(logs, (str, bytes)) or not list(logs):
        raise InputError("give the logs to gate as a list of one or more paths (a gate over no log would pass)")
    if policy is None:
        policy = find_policy(os.getcwd())
    loaded = load_policy(policy) if policy else None
    level = fail_on or (loaded.fail_on if loaded else None) or DEFAULT_FAIL_ON
    entries = gating.read_baseline(baseline) if baseline else None
    return GateResult(gating.run(list(logs), fail_on=level, baseline=entries, policy=loaded,
                                 deployment=deployment or (loaded.deployment if loaded else None),
                                 fail_on_unknown=fail_on_unknown or bool(loaded and loaded.fail_on_unknown),
                                 **analyse_options(**inputs)))


def report_of(path: str, **inputs: Any) -> dict[str, Any]:
    """One log's report as data (the JSON contract), as the many-logs workers make it."""
    return explain(path, **inputs).to_dict()


@frozen
class Outcome:
    """One of many logs: its report, or the one-line error that stopped it (never both)."""

    path: str
    report: Optional[Report]
    error: Optional[str]


def explain_many(logs: Sequence[str], *, jobs: Optional[int] = None, executor: Any = None,
                 **inputs: Any) -> Iterator[Outcome]:
    """explain() over many logs (paths; a directory stands for its *.log and *.log.gz files),
    in `jobs` worker processes (default: one per core) or on `executor`, any
    `concurrent.futures.Executor` (a Dask client's `get_executor()` runs it across a cluster),
    yielded in input order. A log that cannot be read is an Outcome with its error; the others
    go on."""
    from capdiag.batch import explain_many as run_many

    for item in run_many(logs, report_of, jobs=jobs, executor=executor, **inputs):
        error = item.error if item.error is None or FROM_CLI.get() else for_python(item.error)
        yield Outcome(item.path, None if item.report is None else Report(item.report), error)


class Plan(_Document):
    """The pre-deploy worksheet: buckets per GPU, the verdict, the smallest TP that fits, the
    most concurrent requests, and when it does not fit, the nearest deployments that do."""

    @property
    def verdict(self) -> Optional[str]:
        return self._data["verdict"]

    @python_errors
    def render(self, fmt: str = "text") -> str:
        from capdiag.render import render_plan

        return render_plan(self._data, _check_format(fmt))


@python_errors
def plan(*, config_json: Optional[str] = None, model: Optional[str] = None, params: Union[str, float, None] = None,
         layers: Optional[int] = None, kv_heads: Optional[int] = None, head_dim: Optional[int] = None,
         hidden: Optional[int] = None, weight_dtype: Optional[str] = None, kv_dtype: Optional[str] = None,
         contexts: Optional[Sequence[int]] = None, concurrency: Optional[int] = None,
         workloads: Sequence[Union[str, tuple[int, int]]] = (), gpu: Optional[str] = None,
         gpu_total_gib: Optional[float] = None, gpus: Optional[int] = None, tp: Optional[int] = None,
         framework: Optional[str] = None, fraction: Optional[float] = None, headroom: float = 0.15,
         training: Optional[str] = None, from_log: Optional[LogInput] = None,
         framework_version: Optional[str] = None, settings: Sequence[str] = ()) -> Plan:
    """Size a deployment before it exists (`capdiag plan`).

    The model's shape comes from one of `config_json` (a path), `model` (a Hugging Face id,
    ORG/NAME: its config.json and, for the exact weight bytes, its safetensors index, through
    huggingface_hub's cache, HF_TOKEN and HF_HUB_OFFLINE), or `layers`/`kv_heads`/`head_dim`
    (`hidden` for the activation estimate) with `params` ("70B", "7e10" or a number).
    `workloads` are "8192x16" or (8192, 16); `from_log` fills TP, dtypes, framework, fraction,
    context and version from a start-up (what is given here wins) and compares the prediction
    with it. `framework_version` plans for that release (else the newest the model knows);
    `settings` are the framework's own settings as "KEY=VALUE" (the keys `--what-if` takes).
    """
    from capdiag.rules import PLAN
    from capdiag.rules.plan import driver as planning

    layers, kv_heads, head_dim, hidden = (check(flag, v) for flag, v in (
        ("layers", layers), ("kv-heads", kv_heads), ("head-dim", head_dim), ("hidden", hidden)))
    tp, gpus, concurrency, fraction = check("tp", tp), check("gpus", gpus), check("concurrency", concurrency), \
        check("fraction", fraction)
    headroom, contexts = check("headroom", headroom), check_lengths("context", contexts)

    shapes = [name for name, given in (("--config-json", config_json), ("--model", model),
                                       ("--layers/--kv-heads/--head-dim", layers or kv_heads or head_dim)) if given]
    if len(shapes) > 1:
        raise InputError(f"give the model's shape once: {' or '.join(shapes)}")
    shape = planning.shape_config(layers, kv_heads, head_dim, hidden)
    stored = None
    if model is not None:
        from capdiag.hub import model_files

        shape, stored = model_files(model)
    count = planning.parse_params(params) if isinstance(params, str) else params
    if count is None and shape is None and config_json is None:
        raise InputError("give --params, --config-json or --model")
    mixes = tuple(planning.parse_workload(w) if isinstance(w, str) else tuple(w) for w in workloads)
    if concurrency:
        if not contexts:
            raise InputError("--concurrency needs --context")
        mixes += ((contexts[0], concurrency),)
    analysis = logged = None
    if from_log is not None:
        analysis = analyse(from_log, gpu=gpu, gpu_total_gib=gpu_total_gib, config_json=config_json)
        logged = planning.request_from_log(analysis.knowledge, analysis.path, analysis.framework, count)

    def pick(given, key, default):
        return given if given is not None else getattr(logged, key) if logged is not None else default

    from capdiag.whatif import parse_settings

    request = F.PlanRequest(
        evidence=F.Evidence(F.INPUT_LINE, "capdiag plan" if logged is None else logged.evidence.text, 0, "input"),
        params=count, weight_dtype=pick(weight_dtype, "weight_dtype", None), kv_dtype=pick(kv_dtype, "kv_dtype", None),
        workloads=mixes, contexts=tuple(contexts or ()) or pick(None, "contexts", ()), gpus=pick(gpus, "gpus", None),
        tp=pick(tp, "tp", None), framework=pick(framework, "framework", "sglang"),
        fraction=pick(fraction, "fraction", None), headroom=headroom, training=training,
        weights_as_stored=stored is not None and weight_dtype is None,
        version=pick(framework_version, "version", None),
        settings=tuple(sorted(parse_settings(tuple(settings), "--set").items())))
    report = planning.plan(PLAN, request, config_json=config_json, gpu=gpu, gpu_total_gib=gpu_total_gib, model=shape,
                           weights=stored)
    if analysis is not None:
        report["from_log"] = {"path": analysis.path, "comparison": planning.compare_with_log(report, analysis.knowledge)}
    return Plan(report)


class Diff(_Document):
    """Two start-ups compared: configuration, memory per category, capacity, findings."""

    @python_errors
    def render(self, fmt: str = "text", *, width: Optional[int] = None) -> str:
        """The diff in `fmt`; text is laid out to `width` columns (default 100)."""
        from capdiag.render import render_diff
        from capdiag.terminal import DEFAULT_WIDTH

        return render_diff(self._data, _check_format(fmt), width or DEFAULT_WIDTH)


@python_errors
def diff(before: LogInput, after: LogInput, **inputs: Any) -> Diff:
    """Compare two start-up logs; `inputs` as for explain(), applied to both."""
    from capdiag.report import build_diff

    return Diff(build_diff(_analysis(before, **inputs), _analysis(after, **inputs)))


def _check_format(fmt: str) -> str:
    if fmt not in ("text", "markdown", "json"):
        raise InputError(f"--format {fmt}: one of text, markdown, json")
    return fmt
