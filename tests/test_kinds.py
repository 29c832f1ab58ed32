"""What each fact class declares about its line kind (Fact's class attributes), and the tables
generated from it: a kind is declared once, and these tests say when a declaration is missing
or points nowhere."""
from __future__ import annotations

import re
from pathlib import Path

import attrs

from capdiag import facts as F, launches, source
from capdiag.parsing import FRAMEWORKS
from capdiag.parsing import sglang as sglang_parsing, vllm as vllm_parsing

DOC = Path(__file__).resolve().parents[1] / "docs" / "report-json.md"
LOG_MODULES = {F.base.__name__: None, F.failures.__name__: None, F.sglang.__name__: "sglang",
               F.vllm.__name__: "vllm"}
# kinds no log line is: the framework bases, and a line that could not become a fact
NOT_LINE_KINDS = (F.Fact, F.SGLangFact, F.VllmFact, F.UnreadLine)


def _line_kinds():
    return [k for k in F.KINDS if k.__module__ in LOG_MODULES and k not in NOT_LINE_KINDS]


def test_every_line_kind_names_its_prefilter_keywords():
    """A kind without keywords is never parsed: the prefilter drops every line of it."""
    assert [k.__name__ for k in _line_kinds() if not k.KEYWORDS] == []
    assert source.KEYWORDS == F.KEYWORDS and set(F.KEYWORDS) == {w for k in F.KINDS for w in k.KEYWORDS}


def test_every_kind_a_transformer_makes_is_a_line_kind():
    named = {getattr(F, name) for module in (sglang_parsing, vllm_parsing)
             for name in re.findall(r"\bF\.([A-Z]\w+)", Path(module.__file__).read_text(encoding="utf-8"))}
    made = {k for k in named if isinstance(k, type) and issubclass(k, F.Fact)}
    assert len(made) > 40 and made <= set(_line_kinds())


def test_the_framework_is_the_module_the_kind_lives_in():
    for kind in F.KINDS:
        assert kind.FRAMEWORK == LOG_MODULES.get(kind.__module__), kind.__name__
        assert kind.FRAMEWORK in FRAMEWORKS + (None,)


def test_only_line_kinds_play_a_part_in_launches():
    flagged = {k for flag in ("RANK_NEUTRAL", "OPENS_LAUNCH", "BEGINS_RANK", "FAILS_STARTUP")
               for k in F.kinds_where(flag)}
    assert flagged <= set(_line_kinds()) | {F.UnreadLine}
    # a line that opens a start-up is the launching process's, so it names no rank
    assert set(F.kinds_where("OPENS_LAUNCH")) <= set(F.kinds_where("RANK_NEUTRAL"))
    assert launches._OPENERS == F.kinds_where("OPENS_LAUNCH") and launches._FAILURES == F.kinds_where("FAILS_STARTUP")


def test_observed_keys_name_real_attributes_and_are_documented():
    doc = DOC.read_text(encoding="utf-8")
    for kind, attr, key in F.OBSERVED:
        fields = {a.name for a in attrs.fields(kind)}
        assert (attr.partition(".")[0] if attr.startswith("values.") else attr) in fields, (kind.__name__, attr)
        assert f"`{key}`" in doc, f"{key} ({kind.__name__}.{attr}) is not in docs/report-json.md"
    pairs = [(kind, key) for kind, _, key in F.OBSERVED]
    assert len(pairs) == len(set(pairs)), "a kind fills one observed key twice"


def test_input_kinds_are_not_log_lines():
    assert F.INPUT_KINDS and all(k.__module__ == F.inputs.__name__ for k in F.INPUT_KINDS)
    assert not {k for k in F.INPUT_KINDS if k.KEYWORDS or k.OBSERVED}


def test_every_kind_shares_facts_methods_and_they_act_as_attrs_own():
    """attrs writes only each kind's __init__ (`frozen_fact`); Fact's one __repr__, __eq__ and
    __hash__ give what the methods attrs would have written give."""
    assert [(k.__name__, m) for k in F.KINDS for m in ("__repr__", "__eq__", "__ne__", "__hash__")
            if m in vars(k) and k is not F.Fact] == []
    kind = F.LoadWeightEnd
    twin = attrs.make_class(kind.__name__, {a.name: attrs.field(default=a.default, kw_only=True)
                                            for a in attrs.fields(kind)}, frozen=True)
    values = {"evidence": F.Evidence(7, "Load weight end. avail mem=60.10 GB"), "rank": F.Rank(tp=1),
              "avail_gib": 60.1, "dtype": "torch.bfloat16"}
    fact, same, other = kind(**values), kind(**values), kind(**{**values, "avail_gib": 60.2})
    assert repr(fact) == repr(twin(**values))
    assert fact == same and not fact != same and hash(fact) == hash(same)
    assert fact != other and not fact == other
    assert fact.__eq__(twin(**values)) is NotImplemented and fact != F.LoadWeightBegin(evidence=fact.evidence, avail_gib=60.1)
