"""The judge's job, typed: written by the caller, read by the judge and its workers.

A judge is started under its `Conditions` (`conditions.json`: the device, backend,
threads and memory its workers start with, whatever the task), then given the job known
before its candidate (`JobSpec`, as `standby.json`, with the init seed the caller drew),
and last the same job with what the candidate's evaluation asks (`Asked`: `job.json`).
Each worker reads its own part (`WorkerJob`, its box's `job.json`). `to_json` and
`from_json` are the only translation: the keys on disk are the fields' names, and a
field that a stage does not know yet is absent there.

Dependency-free: the caller, the keeper, the judge and the workers import it first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

ROLES = ("reference", "candidate")  # a judge's two workers, each in its own box


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def _whole(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True)
class Conditions:
    """What a judge and its workers are started under, whatever the task: a judge
    started ahead (`standby`) or kept between commands (`keeper`) serves only a job of
    the same conditions."""

    device: str
    backend: str
    threads: int
    memory_mb: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Conditions:
        """KeyError, TypeError or ValueError when `data` is not `to_json`'s object."""
        return cls(
            device=str(data["device"]),
            backend=str(data["backend"]),
            threads=int(data["threads"]),
            memory_mb=int(data["memory_mb"]),
        )


@dataclass(frozen=True)
class Asked:
    """What the candidate's evaluation asks of its judge, known only with the candidate."""

    compare: bool = False  # timed against an incumbent, which the reference side holds
    decide: float | None = None  # the speedup the caller compares with (`stats.settled`)
    count_work: bool = False  # count the reference's work (`roofline`): none kept yet

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Asked:
        return cls(
            compare=bool(data.get("compare")),
            decide=_number(data.get("decide")),
            count_work=bool(data.get("count_work")),
        )


@dataclass(frozen=True)
class WorkerJob:
    """What one worker is told: the code to load (the reference's, or `candidate_file`
    in its box) and how; nothing of the inputs or their seeds."""

    name: str
    kind: str
    backend: str
    entry: str | None
    device: str
    init_seed: int
    allow_torch: tuple[str, ...]  # the aten ops the policy lets torch compute
    baseline: str | None = None  # "compiled": the reference worker runs torch.compile
    candidate_file: str | None = None  # in the box; none: the reference's `reference.py`

    def to_json(self) -> dict[str, Any]:
        data = {**asdict(self), "allow_torch": list(self.allow_torch)}
        for key in ("baseline", "candidate_file"):  # on disk only when set
            if data[key] is None:
                del data[key]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WorkerJob:
        return cls(
            name=str(data["name"]),
            kind=str(data["kind"]),
            backend=str(data["backend"]),
            entry=_text(data["entry"]),
            device=str(data["device"]),
            init_seed=int(data["init_seed"]),
            allow_torch=tuple(str(op) for op in data.get("allow_torch", [])),
            baseline=_text(data.get("baseline")),
            candidate_file=_text(data.get("candidate_file")),
        )


@dataclass(frozen=True)
class JobSpec:
    """All of a job that is known before its candidate (`runner`): a judge started ahead
    prepares its workers, input sets and expected outputs from it. `init_seed` is drawn
    when a judge is given the job (`jobfolder.Started.assign`), `asked` added when the
    candidate is known."""

    name: str
    kind: str
    backend: str
    entry: str | None
    device: str
    allow_torch: tuple[str, ...]
    input_sets: int
    max_trials: int
    target_half_width: float  # the 95 % interval's, relative, at which timing stops
    run_to_run_cv: float  # how much a speedup moves between evaluations
    compile_s: float
    verify_s: float
    time_s: float
    memory_mb: int
    inputs_ahead_mb: int
    threads: int
    baseline: str | None = None  # "compiled": the reference worker runs torch.compile
    init_seed: int | None = None
    asked: Asked | None = None

    @property
    def conditions(self) -> Conditions:
        """What a judge for this job is started under."""
        return Conditions(self.device, self.backend, self.threads, self.memory_mb)

    def seeded(self, init_seed: int) -> JobSpec:
        return replace(self, init_seed=init_seed)

    def asking(self, asked: Asked) -> JobSpec:
        return replace(self, asked=asked)

    def worker(self) -> WorkerJob:
        """A worker's part of the job (the reference's; a candidate's adds its file)."""
        if self.init_seed is None:
            raise ValueError("a worker's job needs the judge's init seed")
        return WorkerJob(
            name=self.name,
            kind=self.kind,
            backend=self.backend,
            entry=self.entry,
            device=self.device,
            init_seed=self.init_seed,
            allow_torch=self.allow_torch,
            baseline=self.baseline,
        )

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _LATER}
        data["allow_torch"] = list(self.allow_torch)
        if self.baseline is not None:
            data["baseline"] = self.baseline
        if self.init_seed is not None:
            data["init_seed"] = self.init_seed
        if self.asked is not None:
            data.update(asdict(self.asked))
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobSpec:
        """KeyError, TypeError or ValueError when `data` is not `to_json`'s object."""
        asked = Asked.from_json(data) if any(f.name in data for f in fields(Asked)) else None
        return cls(
            name=str(data["name"]),
            kind=str(data["kind"]),
            backend=str(data["backend"]),
            entry=_text(data["entry"]),
            device=str(data["device"]),
            allow_torch=tuple(str(op) for op in data["allow_torch"]),
            input_sets=int(data["input_sets"]),
            max_trials=int(data["max_trials"]),
            target_half_width=float(data["target_half_width"]),
            run_to_run_cv=float(data["run_to_run_cv"]),
            compile_s=float(data["compile_s"]),
            verify_s=float(data["verify_s"]),
            time_s=float(data["time_s"]),
            memory_mb=int(data["memory_mb"]),
            inputs_ahead_mb=int(data["inputs_ahead_mb"]),
            threads=int(data["threads"]),
            baseline=_text(data.get("baseline")),
            init_seed=_whole(data.get("init_seed")),
            asked=asked,
        )


_LATER = frozenset({"baseline", "init_seed", "asked"})  # on disk only once known
