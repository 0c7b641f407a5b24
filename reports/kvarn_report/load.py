"""Loading a kvarn-eval run directory.

Everything except the summary is optional: a missing or unreadable piece is recorded in
`RunData.notes` and the report carries on without it.  The contract is described in
docs/results.md and docs/reports.md.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

try:  # h5py is optional at import time: without it, arrays are skipped with a note.
    import h5py  # type: ignore
except Exception:  # pragma: no cover - depends on the environment
    h5py = None

# Summary scopes of the error-accumulation rows, whose `data` names the model.
ACCUMULATION_SCOPES = ("accumulation", "decode")

# Display order of families; unknown families come after these, alphabetically.
FAMILY_ORDER = ["fp16", "fp8", "kivi", "quarot", "turboquant", "rtn", "varn", "kvarn"]


class ReportError(Exception):
    """A run directory the report cannot be built from at all."""


def _num(v: Any) -> float:
    """A summary value as float; null, empty and unparsable values become NaN."""
    if v is None:
        return math.nan
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    s = str(v).strip()
    if s == "" or s.lower() in ("null", "none", "nan", "na", "n/a"):
        return math.nan
    try:
        return float(s)
    except ValueError:
        return math.nan


def _int(v: Any, default: int = -1) -> int:
    f = _num(v)
    if math.isnan(f):
        return default
    return int(f)


def family_of(method: str, spec: str = "") -> str:
    """Family from the method name or spec when the row does not carry one."""
    if spec and ":" in spec:
        return spec.split(":", 1)[0]
    m = re.match(r"[A-Za-z]+[0-9]*", method or "")
    base = m.group(0).lower() if m else (method or "unknown")
    # "fp8_e4m3" -> fp8, "kivi_2bit" -> kivi, "kvarn_k4v2_g128" -> kvarn
    return base.split("_", 1)[0]


@dataclass(frozen=True)
class MethodKey:
    """One compared configuration: a method name plus its full spec."""

    method: str
    spec: str
    family: str
    label: str  # readable name shown in figures and tables


@dataclass
class Row:
    case_id: str
    method: str
    spec: str
    family: str
    bits: float
    metric: str
    scope: str
    layer: int
    head: int
    value: float
    data: str = ""  # the tiles or, for accumulation/decode rows, the model the row is about
    eff_bits: float = math.nan  # bits/element as stored at the measured length (NaN: not recorded)
    ci_lo: float = math.nan  # bootstrap 95 % CI over units (slabs or prompts), where recorded
    ci_hi: float = math.nan
    ci_units: int = 0


@dataclass
class RunData:
    run_dir: str
    resolved: Dict[str, Any] = field(default_factory=dict)
    provenance: Dict[str, Any] = field(default_factory=dict)
    rows: List[Row] = field(default_factory=list)
    cases: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    throughput: List[Dict[str, Any]] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    methods: List[MethodKey] = field(default_factory=list)
    case_method: Dict[str, MethodKey] = field(default_factory=dict)
    _arrays: Dict[str, Optional[Dict[str, np.ndarray]]] = field(default_factory=dict)

    # ------------------------------------------------------------------ summary queries
    def metrics(self) -> List[str]:
        return sorted({r.metric for r in self.rows})

    def has_metric(self, metric: str) -> bool:
        return any(r.metric == metric for r in self.rows)

    def value(self, key: MethodKey, metric: str, data: Optional[str] = None) -> float:
        """Aggregate value of `metric` for one method (of one `data`, e.g. a model, when given).

        Rows for the whole cache (layer == -1 and head == -1) are preferred; without them the
        per-layer/head rows are averaged.  Several cases of the same method (data tiles, seeds)
        are averaged.  NaN when nothing defined exists.
        """
        rows = [r for r in self.rows if r.metric == metric and self.case_method.get(r.case_id) == key
                and (data is None or r.data == data)]
        if not rows:
            return math.nan
        whole = [r.value for r in rows if r.layer < 0 and r.head < 0 and not math.isnan(r.value)]
        if whole:
            return float(np.mean(whole))
        parts = [r.value for r in rows if not math.isnan(r.value)]
        return float(np.mean(parts)) if parts else math.nan

    def bits(self, key: MethodKey, data: Optional[str] = None) -> float:
        """Steady-state bits/element (`bits_per_element`), one value per (case, data) averaged."""
        return self._per_part_mean(key, data, lambda r: r.bits)

    def effective_bits(self, key: MethodKey, data: Optional[str] = None) -> float:
        """Bits/element as stored at the measured length (`effective_bits`); NaN when the run
        does not record it.  `data=None` covers the tiles (not the per-model accumulation rows)."""
        return self._per_part_mean(key, data, lambda r: r.eff_bits)

    def budget(self, key: MethodKey, data: Optional[str] = None) -> Tuple[float, bool]:
        """(bits, effective): effective bits where the run has them, else steady-state bits."""
        e = self.effective_bits(key, data)
        return (e, True) if not math.isnan(e) else (self.bits(key, data), False)

    def has_effective_bits(self) -> bool:
        return any(not math.isnan(r.eff_bits) for r in self.rows)

    def _per_part_mean(self, key: MethodKey, data: Optional[str], get) -> float:
        parts: Dict[Tuple[str, str], float] = {}
        for r in self.rows:
            if self.case_method.get(r.case_id) != key or math.isnan(get(r)):
                continue
            if data is None and r.scope in ACCUMULATION_SCOPES:
                continue  # model-level budgets belong to their model's table
            if data is not None and r.data != data:
                continue
            parts.setdefault((r.case_id, r.data), get(r))
        if not parts and data is None:  # a run of accumulation rows only
            parts = {(r.case_id, r.data): get(r) for r in self.rows
                     if self.case_method.get(r.case_id) == key and not math.isnan(get(r))}
        return float(np.mean(list(parts.values()))) if parts else math.nan

    def layer_head(self, key: MethodKey, metric: str, data: Optional[str] = None) -> Optional[np.ndarray]:
        """[L, H] matrix of a per-layer/head metric from the summary rows (of one `data` when
        given; NaN where missing)."""
        rows = [
            r
            for r in self.rows
            if r.metric == metric and r.layer >= 0 and r.head >= 0 and self.case_method.get(r.case_id) == key
            and (data is None or r.data == data)
        ]
        if not rows:
            return None
        nl = max(r.layer for r in rows) + 1
        nh = max(r.head for r in rows) + 1
        acc = np.zeros((nl, nh))
        cnt = np.zeros((nl, nh))
        for r in rows:
            if not math.isnan(r.value):
                acc[r.layer, r.head] += r.value
                cnt[r.layer, r.head] += 1
        with np.errstate(invalid="ignore", divide="ignore"):
            out = np.where(cnt > 0, acc / np.maximum(cnt, 1), np.nan)
        return out

    def cases_of(self, key: MethodKey) -> List[str]:
        return sorted(c for c, k in self.case_method.items() if k == key)

    # ------------------------------------------------------------------ accumulation models
    def accumulation_models(self) -> List[Tuple[str, Optional[int]]]:
        """(name, head_dim) of every model of the run's error-accumulation block, in config order.

        Names come from resolved.json, the summary rows of the accumulation/decode scopes and the
        arrays' `accumulation_models/<name>` groups; head_dim from the cases' records (None when
        no record has it).  Empty for a run without per-model accumulation data.
        """
        block = self.resolved.get("accumulation") if isinstance(self.resolved, dict) else None
        listed = block.get("models") if isinstance(block, dict) else None
        names = list(dict.fromkeys(str(m["name"]) for m in listed or [] if isinstance(m, dict) and m.get("name")))
        extra = {r.data for r in self.rows if r.scope in ACCUMULATION_SCOPES and r.data}
        for c in sorted(self.case_method):
            a = self.arrays(c) or {}
            extra |= {k.split("/")[1] for k in a if k.startswith("accumulation_models/") and k.count("/") >= 2}
        names += sorted(extra - set(names))
        dims: Dict[str, int] = {}
        for case in self.cases.values():
            block = case.get("accumulation") if isinstance(case, dict) else None
            for m in (block.get("models") if isinstance(block, dict) else None) or []:
                if isinstance(m, dict) and m.get("model") and isinstance(m.get("head_dim"), int):
                    dims.setdefault(str(m["model"]), m["head_dim"])
        return [(n, dims.get(n)) for n in names]

    def prompt_values(self, key: MethodKey, data: str, metric: str) -> Dict[str, float]:
        """{prompt_id: value} of an accumulation/decode `metric` for one model (`data`, as in the
        summary rows) from the case records' per-prompt summaries; several cases of the method
        (seeds) are averaged per prompt.  Empty when the records hold no per-prompt values."""
        acc: Dict[str, List[float]] = {}
        for c in self.cases_of(key):
            block = self.cases.get(c, {}).get("accumulation")
            for m in (block.get("models") if isinstance(block, dict) else None) or []:
                if not isinstance(m, dict) or str(m.get("model")) != data:
                    continue
                for p in m.get("prompts") or []:
                    summ = p.get("summary") if isinstance(p, dict) else None
                    v = _num(summ.get(metric)) if isinstance(summ, dict) else math.nan
                    if not math.isnan(v):
                        acc.setdefault(str(p.get("prompt_id")), []).append(v)
        return {pid: float(np.mean(v)) for pid, v in acc.items()}

    def interval(self, key: MethodKey, metric: str, data: Optional[str] = None) -> Optional[Tuple[float, float, int]]:
        """(lo, hi, units) of the bootstrap CI the engine recorded on the whole-cache row of
        `metric` (of `data` when given); None without one, or when several cases/data files would
        have to be averaged (their intervals do not combine)."""
        rows = [r for r in self.rows if r.metric == metric and self.case_method.get(r.case_id) == key
                and (data is None or r.data == data) and r.layer < 0 and r.head < 0]
        if len(rows) != 1 or math.isnan(rows[0].ci_lo) or math.isnan(rows[0].ci_hi):
            return None
        return rows[0].ci_lo, rows[0].ci_hi, rows[0].ci_units

    def unit_values(self, key: MethodKey, data: str, metric: str) -> Dict[str, float]:
        """{unit: value} behind a row's CI: tile units ((sequence, layer, KV head) slabs) from the
        case records' `units`, else per-prompt values (prompt_values).  Several cases of the method
        are averaged per unit."""
        acc: Dict[str, List[float]] = {}
        for c in self.cases_of(key):
            units = self.cases.get(c, {}).get("units")
            per = units.get(data, {}).get(metric) if isinstance(units, dict) and isinstance(units.get(data), dict) else None
            for u, v in (per.items() if isinstance(per, dict) else []):
                if not math.isnan(_num(v)):
                    acc.setdefault(str(u), []).append(_num(v))
        if acc:
            return {u: float(np.mean(v)) for u, v in acc.items()}
        return self.prompt_values(key, data, metric)

    # ------------------------------------------------------------------ arrays
    def arrays(self, case_id: str) -> Optional[Dict[str, np.ndarray]]:
        """All numeric datasets of arrays/<case_id>.h5 by path (and numeric attributes as
        "group@attribute"), or None when there is no such file."""
        if case_id in self._arrays:
            return self._arrays[case_id]
        path = os.path.join(self.run_dir, "arrays", case_id + ".h5")
        out: Optional[Dict[str, np.ndarray]] = None
        if os.path.isfile(path):
            if h5py is None:
                self._note_once("h5py is not installed: arrays/*.h5 were not read.")
            else:
                try:
                    out = {}
                    with h5py.File(path, "r") as f:

                        def visit(name, obj):
                            if isinstance(obj, h5py.Dataset):
                                try:
                                    out[name] = np.asarray(obj[()], dtype=float)
                                except (TypeError, ValueError):
                                    pass  # non-numeric dataset: not plotted
                            for an, av in obj.attrs.items():  # numeric attributes as "path@name"
                                try:
                                    out[f"{name}@{an}"] = np.asarray(av, dtype=float)
                                except (TypeError, ValueError):
                                    pass

                        f.visititems(visit)
                except Exception as e:  # corrupt file: note it, keep going
                    self.notes.append(f"arrays/{case_id}.h5 could not be read ({e}); skipped.")
                    out = None
        self._arrays[case_id] = out
        return out

    def method_array(self, key: MethodKey, name: str) -> Optional[np.ndarray]:
        """A dataset averaged over the method's cases that have it with a common shape."""
        found = []
        for c in self.cases_of(key):
            a = self.arrays(c)
            if a and name in a:
                found.append(a[name])
        if not found:
            return None
        shape = found[0].shape
        same = [x for x in found if x.shape == shape]
        with np.errstate(invalid="ignore"):
            return np.nanmean(np.stack(same), axis=0) if len(same) > 1 else same[0]

    def _note_once(self, msg: str) -> None:
        if msg not in self.notes:
            self.notes.append(msg)


# ---------------------------------------------------------------------- readers


def _read_json(path: str, notes: List[str], what: str) -> Any:
    if not os.path.isfile(path):
        notes.append(f"{what} is missing.")
        return None
    try:
        with open(path, "r", encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        notes.append(f"{what} could not be read ({e}).")
        return None


def _raw_rows(run_dir: str, notes: List[str]) -> List[Dict[str, Any]]:
    jl = os.path.join(run_dir, "summary.jsonl")
    cs = os.path.join(run_dir, "summary.csv")
    if os.path.isfile(jl):
        out = []
        with open(jl, "r", encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    obj = json.loads(line)
                except ValueError:
                    notes.append(f"summary.jsonl line {i} is not valid JSON; skipped.")
                    continue
                if isinstance(obj, dict):
                    out.append(obj)
        return out
    if os.path.isfile(cs):
        with open(cs, "r", encoding="utf-8", newline="") as f:
            return list(csv.DictReader(f))
    raise ReportError(f"{run_dir}: neither summary.jsonl nor summary.csv exists; is this a kvarn-eval run directory?")


def _readable(method: str, spec: str) -> str:
    """Readable name: 'kvarn_k4v2_g128' -> 'KVarN K4V2 g128', 'fp8_e4m3' -> 'FP8 E4M3'."""
    names = {
        "fp16": "FP16",
        "fp8": "FP8",
        "kivi": "KIVI",
        "kvarn": "KVarN",
        "quarot": "QuaRot",
        "turboquant": "TurboQuant",
        "rtn": "RTN",
        "varn": "VarN",
    }
    src = method or spec
    if ":" in src:  # a spec: family:key=value,...
        fam, params = src.split(":", 1)
        return f"{names.get(fam, fam)} {params}"
    parts = src.split("_")
    out = [names.get(parts[0].lower(), parts[0])]
    for p in parts[1:]:
        if re.fullmatch(r"\d+bit", p):
            out.append(p[:-3] + "-bit")
        elif re.fullmatch(r"k\d+v\d+", p) or re.fullmatch(r"e\dm\d", p):
            out.append(p.upper())
        elif p == "nc":
            out.append("NC")  # vLLM "nc": norm correction
        else:
            out.append(p)
    return " ".join(out)


def _fill_effective_bits(rows: List[Row], cases: Dict[str, Dict[str, Any]]) -> None:
    """Rows of a summary without the `effective_bits` column take it from their case record's rows
    of the same data, else from the case's `storage.effective_bits` row, where the run has them."""
    stored = {(r.case_id, r.data): r.value for r in rows
              if r.metric == "storage.effective_bits" and not math.isnan(r.value)}
    for cid, rec in cases.items():
        for row in (rec.get("rows") if isinstance(rec, dict) else None) or []:
            if isinstance(row, dict) and not math.isnan(_num(row.get("effective_bits"))):
                stored.setdefault((cid, str(row.get("data") or "")), _num(row.get("effective_bits")))
    for r in rows:
        if math.isnan(r.eff_bits):
            r.eff_bits = stored.get((r.case_id, r.data), math.nan)


def load_run(run_dir: str) -> RunData:
    if not os.path.isdir(run_dir):
        raise ReportError(f"{run_dir}: not a directory")
    run = RunData(run_dir=os.path.abspath(run_dir))
    notes = run.notes
    run.resolved = _read_json(os.path.join(run_dir, "resolved.json"), notes, "resolved.json") or {}
    run.provenance = _read_json(os.path.join(run_dir, "provenance.json"), notes, "provenance.json") or {}

    raw = _raw_rows(run_dir, notes)
    for d in raw:
        method = str(d.get("method") or "")
        spec = str(d.get("spec") or "")
        metric = str(d.get("metric") or "")
        if not metric or not (method or spec):
            continue
        fam = str(d.get("family") or "") or family_of(method, spec)
        run.rows.append(
            Row(
                case_id=str(d.get("case_id") or f"{method}|{spec}"),
                method=method,
                spec=spec,
                family=fam,
                bits=_num(d.get("bits_per_element")),
                metric=metric,
                scope=str(d.get("scope") or ""),
                layer=_int(d.get("layer")),
                head=_int(d.get("head")),
                value=_num(d.get("value")),
                data=str(d.get("data") or ""),
                eff_bits=_num(d.get("effective_bits")),
                ci_lo=_num(d.get("ci_lo")),
                ci_hi=_num(d.get("ci_hi")),
                ci_units=_int(d.get("ci_units"), 0),
            )
        )
    if not run.rows:
        notes.append("The summary has no rows: tables and figures are empty.")

    # Method keys: (method, spec).  A method name that stands for several specs (an ablation
    # axis) is labelled by its spec so that the labels stay distinct.
    pairs: Dict[Tuple[str, str], str] = {}
    for r in run.rows:
        pairs.setdefault((r.method, r.spec), r.family)
    specs_per_method: Dict[str, int] = {}
    for m, _s in pairs:
        specs_per_method[m] = specs_per_method.get(m, 0) + 1
    keys: Dict[Tuple[str, str], MethodKey] = {}
    used_labels: Dict[str, int] = {}
    for (m, s), fam in pairs.items():
        label = _readable(m, "") if m and specs_per_method[m] == 1 else _readable("", s or m)
        keys[(m, s)] = MethodKey(m, s, fam, label)
    # disambiguate identical labels deterministically
    for k in sorted(keys.values(), key=lambda k: (k.method, k.spec)):
        used_labels[k.label] = used_labels.get(k.label, 0) + 1
    for pk, k in list(keys.items()):
        if used_labels[k.label] > 1:
            keys[pk] = MethodKey(k.method, k.spec, k.family, f"{k.label} [{k.spec}]")
    for r in run.rows:
        run.case_method[r.case_id] = keys[(r.method, r.spec)]

    def order(k: MethodKey):
        fam_i = FAMILY_ORDER.index(k.family) if k.family in FAMILY_ORDER else len(FAMILY_ORDER)
        b = run.bits(k)
        return (fam_i, k.family, -(b if not math.isnan(b) else 0.0), k.label)

    run.methods = sorted(set(keys.values()), key=order)

    # per-case detail
    cdir = os.path.join(run_dir, "cases")
    if os.path.isdir(cdir):
        for name in sorted(os.listdir(cdir)):
            if name.endswith(".json"):
                try:
                    with open(os.path.join(cdir, name), "r", encoding="utf-8") as f:
                        run.cases[name[:-5]] = json.load(f)
                except (OSError, ValueError) as e:
                    notes.append(f"cases/{name} could not be read ({e}).")
    _fill_effective_bits(run.rows, run.cases)
    if not os.path.isdir(os.path.join(run_dir, "arrays")):
        notes.append("No arrays/ directory: figures that need per-position, per-layer or decode arrays use the summary or are skipped.")

    tp_path = os.path.join(run_dir, "throughput.json")
    if os.path.isfile(tp_path):
        tp = _read_json(tp_path, notes, "throughput.json")
        if isinstance(tp, dict):  # tolerate {"results": [...]} as well as a bare list
            tp = tp.get("results") or tp.get("benchmarks") or []
        if isinstance(tp, list):
            run.throughput = [e for e in tp if isinstance(e, dict) and e.get("method")]
    return run
