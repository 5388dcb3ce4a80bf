"""One numeric encoding of (config, workload, hardware), shared by both cost models.

Every knob column is *centred on the knob's default*, so the intercept of a model is its
prediction for the default config and a coefficient times a setting's column delta is that
setting's effect relative to the default (what a :class:`~infrarsi.models.KnobPrior` states):

* ``ordinal`` knob with all-positive values -> ``log2(value / default)``; otherwise
  ``value - default``;
* ``categorical`` knob -> one-hot of every non-default value (treatment coding: the default is
  the reference level, so no column is redundant with the intercept);
* ``bool`` knob (a patch is one) -> ``float(value) - float(default)``;
* an inactive knob is read at its default (the space's ``normalize`` already does that).

Then, optionally, :meth:`WorkloadSignature.vector` and :meth:`HardwareFingerprint.vector`,
and the napkin physics of the config on its workload and hardware (:mod:`infrarsi.models.physics`:
log2 of the per-device memory estimate, the pipeline bubble, communication over compute) --
the sums and ratios of knobs that a log-linear model of the knob columns alone cannot express.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from infrarsi.models.physics import PHYSICS_FEATURES, physics_vector
from infrarsi.space import SearchSpace
from infrarsi.trial import HardwareFingerprint, TrialRecord, TrialStatus, WorkloadSignature

WORKLOAD_FEATURES = (
    "wl_moe", "wl_log10_params", "wl_layers", "wl_log2_hidden", "wl_log2_heads",
    "wl_log2_seq", "wl_log2_gbs", "wl_log2_experts", "wl_top_k",
)
HARDWARE_FEATURES = ("hw_log2_mem_bytes", "hw_log2_devices", "hw_log2_nodes", "hw_log10_flops")
# The range each workload/hardware feature spans between the jobs a bank holds (a 1B to a 100B+
# model, 1 to 128 nodes, ...), in the feature's own units: a prior on a context column's slope
# is stated per span, because "1 unit" means one layer for one column and 10x parameters for
# another.
CONTEXT_SPANS: dict[str, float] = {
    "wl_moe": 1.0, "wl_log10_params": 2.0, "wl_layers": 64.0, "wl_log2_hidden": 3.0,
    "wl_log2_heads": 3.0, "wl_log2_seq": 4.0, "wl_log2_gbs": 5.0, "wl_log2_experts": 7.0,
    "wl_top_k": 8.0, "hw_log2_mem_bytes": 2.0, "hw_log2_devices": 7.0, "hw_log2_nodes": 6.0,
    "hw_log10_flops": 1.5,
}


@dataclass(frozen=True)
class Column:
    """One encoded feature: which knob it reads (None for workload/hardware) and how."""

    name: str
    knob: str | None
    kind: str  # "log2" | "linear" | "onehot" | "bool" | "workload" | "hardware" | "physics"
    setting: Any = None  # the one-hot's value
    ref: float = 0.0  # the default's raw value, for log2/linear/bool


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


class FeatureEncoder:
    """Encode configs (plus workload and hardware keys) as a float matrix.

    Scikit-learn style: ``fit`` freezes the column layout (the knob layout comes from the
    space's declarations alone, so fitting needs no data and accepts any iterable, records
    included) and ``transform(configs, workloads, hardwares)`` returns ``(n, n_features)``.
    ``workloads``/``hardwares`` may be one object for every row or one per row.
    """

    def __init__(self, space: SearchSpace, workload_keys: bool = True, hardware_keys: bool = True,
                 physics: bool = True):
        self.space = space
        self.workload_keys = workload_keys
        self.hardware_keys = hardware_keys
        self.physics = physics

    @property
    def _with_physics(self) -> bool:
        return self.physics and self.workload_keys  # the estimates need the workload

    # ---- layout -----------------------------------------------------------------------
    def fit(self, records_or_rows: Iterable[Any] | None = None, y: Any = None) -> FeatureEncoder:
        cols: list[Column] = []
        for k in self.space.knobs:
            if k.kind == "bool":
                cols.append(Column(k.name, k.name, "bool", ref=float(bool(k.default))))
            elif k.kind == "ordinal" and all(_is_num(v) for v in k.values):
                if all(v > 0 for v in k.values):
                    cols.append(Column(f"log2_{k.name}", k.name, "log2", ref=math.log2(k.default)))
                else:
                    cols.append(Column(k.name, k.name, "linear", ref=float(k.default)))
            else:  # categorical, or an ordinal knob whose values are not numbers
                for v in k.values:
                    if v != k.default:
                        cols.append(Column(f"{k.name}={v}", k.name, "onehot", setting=v))
        if self.workload_keys:
            cols += [Column(n, None, "workload") for n in WORKLOAD_FEATURES]
        if self.hardware_keys:
            cols += [Column(n, None, "hardware") for n in HARDWARE_FEATURES]
        if self._with_physics:
            cols += [Column(n, None, "physics") for n in PHYSICS_FEATURES]
        self.columns_ = tuple(cols)
        self.feature_names_out_ = np.array([c.name for c in cols], dtype=object)
        self.n_features_out_ = len(cols)
        return self

    def get_feature_names_out(self, input_features: Any = None) -> np.ndarray:
        self._check_fitted()
        return self.feature_names_out_.copy()

    def _check_fitted(self) -> None:
        if not hasattr(self, "columns_"):
            from sklearn.exceptions import NotFittedError

            raise NotFittedError("FeatureEncoder is not fitted; call .fit() (no data needed) first")

    # ---- encoding ---------------------------------------------------------------------
    def _knob_value(self, col: Column, config: Mapping[str, Any]) -> float:
        knob = self.space.knob(col.knob)
        v = config.get(col.knob, knob.default)
        if col.kind == "log2":
            return math.log2(v) - col.ref if _is_num(v) and v > 0 else math.nan
        if col.kind == "linear":
            return float(v) - col.ref if _is_num(v) else math.nan
        if col.kind == "bool":
            return float(bool(v)) - col.ref
        return 1.0 if v == col.setting else 0.0

    def encode_config(self, config: Mapping[str, Any]) -> np.ndarray:
        """The knob part of one config's row (no workload/hardware columns)."""
        self._check_fitted()
        # a record from another space may carry knobs this one lacks (ZeRO stage on a table
        # without it): they are context, read by the physics columns, not knob columns here
        names = self.space.names
        cfg = self.space.normalize({k: v for k, v in config.items() if k in names}, check=False)
        return np.array(
            [self._knob_value(c, cfg) for c in self.columns_ if c.knob is not None], dtype=float
        )

    def transform(
        self,
        configs: Sequence[Mapping[str, Any]],
        workloads: WorkloadSignature | Sequence[WorkloadSignature | None] | None = None,
        hardwares: HardwareFingerprint | Sequence[HardwareFingerprint | None] | None = None,
    ) -> np.ndarray:
        """``(len(configs), n_features_out_)``; a missing workload/hardware gives NaN columns."""
        self._check_fitted()
        n = len(configs)
        knob_cols = [c for c in self.columns_ if c.knob is not None]
        X = np.empty((n, self.n_features_out_), dtype=float)
        cache: dict[str, np.ndarray] = {}
        for i, cfg in enumerate(configs):
            key = repr(sorted(cfg.items()))
            row = cache.get(key)
            if row is None:
                row = cache[key] = self.encode_config(cfg)
            X[i, : len(knob_cols)] = row
        j = len(knob_cols)
        if self.workload_keys:
            X[:, j : j + len(WORKLOAD_FEATURES)] = _context_block(workloads, n, len(WORKLOAD_FEATURES))
            j += len(WORKLOAD_FEATURES)
        if self.hardware_keys:
            X[:, j : j + len(HARDWARE_FEATURES)] = _context_block(hardwares, n, len(HARDWARE_FEATURES))
            j += len(HARDWARE_FEATURES)
        if self._with_physics:
            X[:, j : j + len(PHYSICS_FEATURES)] = _physics_block(configs, workloads, hardwares)
        return X

    def fit_transform(self, configs, workloads=None, hardwares=None) -> np.ndarray:
        return self.fit().transform(configs, workloads, hardwares)

    def transform_records(self, records: Sequence[TrialRecord]) -> np.ndarray:
        self._check_fitted()
        return self.transform(
            [r.config for r in records], [r.workload for r in records], [r.hardware for r in records]
        )

    def time_dataset(self, records: Sequence[TrialRecord]) -> tuple[np.ndarray, np.ndarray]:
        """``(X, log step time)`` from the ok trials that measured a step time."""
        ok = [r for r in records if r.status is TrialStatus.OK and r.step_time_s]
        y = np.log(np.array([r.step_time_s for r in ok], dtype=float))
        return self.transform_records(ok), y

    def memory_dataset(
        self, records: Sequence[TrialRecord]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(X, memory bytes, observed)``: ok peaks observed, OOMs right-censored at capacity."""
        rows = [(r, r.memory_observation) for r in records]
        rows = [(r, m) for r, m in rows if m is not None]
        X = self.transform_records([r for r, _ in rows])
        mem = np.array([m[0] for _, m in rows], dtype=float)
        obs = np.array([m[1] for _, m in rows], dtype=bool)
        return X, mem, obs

    # ---- what a knob setting means in feature space -------------------------------------
    def setting_delta(self, knob: str, setting: Any) -> np.ndarray:
        """Feature-row difference between ``knob=setting`` and the knob's default."""
        self._check_fitted()
        k = self.space.knob(knob)
        d = np.zeros(self.n_features_out_)
        for j, c in enumerate(self.columns_):
            if c.knob == knob:
                d[j] = self._knob_value(c, {knob: setting}) - self._knob_value(c, {knob: k.default})
        return d

    def knob_settings(self) -> list[tuple[str, Any]]:
        """Every (knob, non-default setting) pair, in declaration order."""
        return [(k.name, v) for k in self.space.knobs for v in k.values if v != k.default]


def _physics_block(configs: Sequence[Mapping[str, Any]], workloads: Any,
                   hardwares: Any) -> np.ndarray:
    n = len(configs)

    def rows(objs: Any) -> Sequence[Any] | None:  # None: one object (or none) for every row
        return objs if objs is not None and not hasattr(objs, "vector") else None

    per_w, per_h = rows(workloads), rows(hardwares)
    out = np.empty((n, len(PHYSICS_FEATURES)))
    cache: dict[tuple[int, int, str], list[float]] = {}
    for i, cfg in enumerate(configs):
        w = per_w[i] if per_w is not None else workloads
        h = per_h[i] if per_h is not None else hardwares
        key = (id(w), id(h), repr(sorted(cfg.items())))
        v = cache.get(key)
        if v is None:
            v = cache[key] = physics_vector(cfg, w, h)
        out[i] = v
    return out


def _context_block(objs: Any, n: int, width: int) -> np.ndarray:
    if objs is None:
        return np.full((n, width), np.nan)
    if hasattr(objs, "vector"):
        return np.tile(np.asarray(objs.vector(), dtype=float), (n, 1))
    out = np.full((n, width), np.nan)
    cache: dict[int, list[float]] = {}
    for i, o in enumerate(objs):
        if o is not None:
            v = cache.get(id(o))
            if v is None:
                v = cache[id(o)] = o.vector()
            out[i] = v
    return out
