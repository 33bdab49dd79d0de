"""The synthesis pipeline: crawl → compose → decontaminate → filter → a task set. Resumable.

Candidates are numbered; candidate ``i`` is composed from (seed, i), so a run can stop anywhere
and a rerun of the same command goes on where it stopped. Decontamination (parsing only) runs
before the filter (processes, timing), so contaminated candidates cost no device time; the
result is the same as filtering first. State lives in a work folder (default ``<out>.synth/``):

    config.json        the settings that decide the results; a rerun with others is refused
    candidates.jsonl   every composed candidate (code, ops, provenance), appended as composed
    verdicts.jsonl     per candidate: the stage that judged it, kept or why not, appended as judged
    compile-cache/     the torch.compile cache the filter's processes share
    similarity.png     histogram of every candidate's similarity to its nearest evaluation task
    dropped.jsonl      the candidates decontamination dropped, with their nearest evaluation task
    summary.json       counts per stage, rejection reasons, Table 3 statistics of the output

The output file (JSONL, or Parquet by its suffix) holds the first ``count`` kept candidates by
index, with provenance, and is rewritten at the end of every run (also an interrupted one). The
loaders read it back (``kernel-env tasks OUT``).
"""

from __future__ import annotations

import hashlib
import heapq
import json
import platform
import statistics
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_env.tasks import Task
from kernel_env.tasks.sources import write_records
from kernel_env.workloads.runs.journal import Journal, JournalError
from kernel_env.workloads.runs.llm import DEFAULT_BASE_URL
from kernel_env.workloads.runs.synth.compose import (
    PAPER_OP_COUNT_WEIGHTS,
    PAPER_TRANSFORMERS_SHARE,
    Candidate,
    ComposeError,
    DeterministicComposer,
    LLMComposer,
    check_weights,
)
from kernel_env.workloads.runs.synth.crawl import PRESETS, crawl
from kernel_env.workloads.runs.synth.decontam import (
    DEFAULT_THRESHOLD,
    EvalIndex,
    Match,
    write_dropped,
    write_histogram,
)
from kernel_env.workloads.runs.synth.filter import (
    FilterError,
    FilterSettings,
    Screener,
    Screening,
)
from kernel_env.workloads.runs.synth.stats import CompositionStats, composition_stats

STATE_VERSION = 1
_COMPOSE_RETRIES = 2


class SynthError(RuntimeError):
    """The run cannot start or go on (mismatched state, unreachable model server); the message says why."""


@dataclass
class SynthConfig:
    """Everything a run needs. ``eval_tasks`` is the decontamination set (``eval_name`` names it in
    the provenance); ``ops`` restricts the seed classes (by name); ``max_candidates`` bounds how
    many are composed (default 20 × count);
    ``compile_cache`` is the torch.compile cache the filter's processes share (default: in the
    work folder; runs may share one)."""

    out: Path
    count: int = 100
    composer: str = "deterministic"
    seed: int = 0
    size: str = "realistic"
    op_weights: dict[int, float] = field(default_factory=lambda: dict(PAPER_OP_COUNT_WEIGHTS))
    transformers: bool = True
    ops: list[str] | None = None
    transformers_share: float = PAPER_TRANSFORMERS_SHARE
    max_candidates: int | None = None
    eval_tasks: list[Task] = field(default_factory=list)
    eval_name: str = ""
    threshold: float = DEFAULT_THRESHOLD
    filter: FilterSettings = field(default_factory=FilterSettings)
    work_dir: Path | None = None
    compile_cache: Path | None = None
    base_url: str = DEFAULT_BASE_URL
    model: str | None = None
    api_key: str = "EMPTY"
    temperature: float = 0.7
    max_tokens: int | None = None
    compose_jobs: int = 4

    @property
    def state_dir(self) -> Path:
        return self.work_dir or self.out.with_name(self.out.name + ".synth")

    @property
    def candidate_limit(self) -> int:
        return self.max_candidates if self.max_candidates is not None else 20 * self.count

    def decisive(self) -> dict[str, Any]:
        """The settings that decide which candidates exist and how they are judged."""
        eval_hash = hashlib.sha256("\n".join(sorted(t.hash for t in self.eval_tasks)).encode()).hexdigest()[:16]
        return {
            "version": STATE_VERSION, "composer": self.composer, "seed": self.seed, "size": self.size,
            "op_weights": {str(k): v for k, v in sorted(self.op_weights.items())}, "transformers": self.transformers,
            "ops": sorted(self.ops) if self.ops else None, "transformers_share": self.transformers_share,
            "eval_set": eval_hash, "threshold": self.threshold, "filter": self.filter.describe(),
            **({"model": self.model, "base_url": self.base_url, "temperature": self.temperature}
               if self.composer == "llm" else {}),
        }


@dataclass
class Verdict:
    """How one candidate was judged: by which stage, kept or not, and why."""

    index: int
    stage: str                     # compose | duplicate | decontam | filter
    kept: bool
    reasons: list[str] = field(default_factory=list)
    match: Match | None = None
    screening: Screening | None = None

    def to_record(self) -> dict[str, Any]:
        return {"index": self.index, "stage": self.stage, "kept": self.kept, "reasons": self.reasons,
                "match": self.match.to_record() if self.match else None,
                "screening": self.screening.to_record() if self.screening else None}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Verdict:
        match = record.get("match")
        screening = record.get("screening")
        return cls(index=int(record["index"]), stage=record["stage"], kept=bool(record["kept"]),
                   reasons=list(record.get("reasons") or []),
                   match=Match(match["task_id"], float(match["similarity"]), match.get("nearest")) if match else None,
                   screening=Screening.from_record(screening) if screening else None)


@dataclass
class SynthProgress:
    """Where a run stands, for progress bars."""

    count: int
    kept: int = 0
    composed: int = 0
    judged: int = 0
    screening: int = 0
    dropped: int = 0
    rejected: int = 0
    event: str = ""


@dataclass
class SynthSummary:
    """What a run produced: the output, the counts per stage, why candidates were rejected, the
    Table 3 statistics of the output, and notes (missing transformers, no histogram, ...)."""

    out: Path
    work_dir: Path
    count: int
    written: int
    candidates: int
    by_stage: dict[str, int]
    reasons: dict[str, int]
    stats: CompositionStats
    histogram: Path | None
    dropped_list: Path
    notes: list[str]
    screen_seconds: dict[str, float] = field(default_factory=dict)  # per screened candidate: median, total

    @property
    def complete(self) -> bool:
        return self.written >= self.count

    def to_record(self) -> dict[str, Any]:
        return {"out": str(self.out), "work_dir": str(self.work_dir), "count": self.count, "written": self.written,
                "complete": self.complete, "candidates": self.candidates, "by_stage": self.by_stage,
                "reasons": self.reasons, "stats": self.stats.to_record(),
                "histogram": str(self.histogram) if self.histogram else None, "dropped_list": str(self.dropped_list),
                "screen_seconds": self.screen_seconds, "notes": self.notes}


# --------------------------------------------------------------------------- state


class _State:
    """The work folder: config check, append-only candidates and verdicts, each a journal
    (``kernel_env.workloads.runs.journal``: a torn last line, from an interrupted write, is cut and its
    candidate redone)."""

    def __init__(self, directory: Path, decisive: dict[str, Any], *, restart: bool):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        config_path = self.dir / "config.json"
        if restart:
            for name in ("candidates.jsonl", "verdicts.jsonl", "config.json"):
                (self.dir / name).unlink(missing_ok=True)
        if config_path.exists():
            stored = json.loads(config_path.read_text())
            if stored != decisive:
                changed = sorted(k for k in set(stored) | set(decisive) if stored.get(k) != decisive.get(k))
                raise SynthError(f"{self.dir} holds a run with other settings ({', '.join(changed)} differ); rerun with "
                                 "the same settings to resume, or pass --restart (or another --out) to start afresh")
        else:
            config_path.write_text(json.dumps(decisive, indent=2) + "\n")
        self._candidates = Journal(self.dir / "candidates.jsonl")
        self._verdicts = Journal(self.dir / "verdicts.jsonl")
        self.candidates = {c.index: c for c in map(Candidate.from_record, self._read(self._candidates))}
        self.verdicts = {v.index: v for v in map(Verdict.from_record, self._read(self._verdicts))}

    @staticmethod
    def _read(journal: Journal) -> list[dict[str, Any]]:
        """The journal's records, the file made (and a torn last line cut) for this run's appends."""
        try:
            records = [entry.record for entry in journal.read()]
            journal.create()
        except JournalError as exc:
            raise SynthError(f"{exc}; pass --restart (or another --out) to start afresh") from None
        return records

    def add_candidate(self, candidate: Candidate) -> None:
        self.candidates[candidate.index] = candidate
        self._candidates.append(candidate.to_record())

    def add_verdict(self, verdict: Verdict) -> None:
        self.verdicts[verdict.index] = verdict
        self._verdicts.append(verdict.to_record())


# --------------------------------------------------------------------------- the run


Composer = DeterministicComposer | LLMComposer


def make_composer(config: SynthConfig) -> tuple[Composer, list[str]]:
    """The configured composer over freshly crawled seeds (restricted to ``config.ops``), and the
    crawl's notes. Raises SynthError for an unknown composer or seed name."""
    preset = PRESETS[config.size]
    found = crawl(transformers=config.transformers)
    seeds = found.seeds
    if config.ops:
        unknown = sorted(set(config.ops) - {s.name for s in seeds})
        if unknown:
            raise SynthError(f"no seed named {', '.join(unknown)}; `kernel-env synth seeds` lists them")
        seeds = [s for s in seeds if s.name in config.ops]
    weights = check_weights(config.op_weights)
    if config.composer == "deterministic":
        composer = DeterministicComposer(seeds, preset, seed=config.seed, op_weights=weights,
                                         transformers_share=config.transformers_share)
    elif config.composer == "llm":
        composer = LLMComposer(seeds, preset, base_url=config.base_url, model=config.model,
                               api_key=config.api_key, seed=config.seed, op_weights=weights,
                               transformers_share=config.transformers_share, temperature=config.temperature,
                               max_tokens=config.max_tokens)
    else:
        raise SynthError(f"unknown composer {config.composer!r}; choose deterministic or llm")
    return composer, found.notes


def run(config: SynthConfig, *, restart: bool = False, on_progress: Callable[[SynthProgress], None] | None = None,
        notes: list[str] | None = None) -> SynthSummary:
    """Run (or resume) the pipeline until ``count`` candidates are kept or ``max_candidates`` were
    composed. ``notes`` start the summary's notes. Raises SynthError when it cannot start or the
    filter cannot run here; KeyboardInterrupt stops it after writing the output so far (a rerun
    resumes)."""
    composer, crawl_notes = make_composer(config)
    notes = [*(notes or []), *crawl_notes]
    if isinstance(composer, LLMComposer):
        try:
            config.model = composer.resolve_model()
        except ComposeError as exc:
            raise SynthError(str(exc)) from None
    try:
        screener = Screener(config.filter, cache_dir=config.compile_cache or config.state_dir / "compile-cache")
    except FilterError as exc:
        raise SynthError(str(exc)) from None
    try:
        state = _State(config.state_dir, config.decisive(), restart=restart)
    except BaseException:
        screener.close()
        raise
    index = EvalIndex(config.eval_tasks)
    if not len(index):
        notes.append("the decontamination set is empty: nothing was checked for contamination (pass --eval-set)")
    progress = SynthProgress(count=config.count)
    try:
        _loop(config, composer, screener, state, index, progress, notes, on_progress or (lambda p: None))
    except FilterError as exc:
        raise SynthError(str(exc)) from None
    finally:
        summary = _finish(config, state, notes)
    return summary


def _loop(config: SynthConfig, composer: Composer, screener: Screener, state: _State, index: EvalIndex, progress: SynthProgress,
          notes: list[str], report: Callable[[SynthProgress], None]) -> None:
    seen_code: dict[str, int] = {}
    for i in sorted(state.candidates):
        candidate = state.candidates[i]
        verdict = state.verdicts.get(i)
        if candidate.code and (verdict is None or verdict.stage != "duplicate"):
            seen_code.setdefault(hashlib.sha256(candidate.code.encode()).hexdigest(), i)
    kept = sum(v.kept for v in state.verdicts.values())
    progress.kept, progress.composed, progress.judged = kept, len(state.candidates), len(state.verdicts)
    ready: list[tuple[int, Candidate]] = []  # a heap: lowest index first, whatever order composing finished in
    composing: dict[Future, int] = {}
    screening: dict[Future, tuple[Candidate, Match]] = {}
    retries: Counter[int] = Counter()
    next_index = 0
    limit = config.candidate_limit
    compose_threads = config.compose_jobs if isinstance(composer, LLMComposer) else 1
    composer_pool = ThreadPoolExecutor(max_workers=compose_threads, thread_name_prefix="synth-compose")
    aborted = True
    try:
        while True:
            wanted = progress.kept < config.count
            while wanted and next_index < limit and len(composing) + len(ready) < 2 * screener.workers:
                i, next_index = next_index, next_index + 1
                if i in state.verdicts:
                    continue
                if i in state.candidates:
                    heapq.heappush(ready, (i, state.candidates[i]))
                else:
                    composing[composer_pool.submit(composer.compose, i)] = i
            # Judged in index order, so that which candidates are kept does not depend on which composed first.
            first_composing = min(composing.values(), default=limit)
            while wanted and ready and len(screening) < screener.workers and ready[0][0] < first_composing:
                _, candidate = heapq.heappop(ready)
                verdict, match = _judge_statically(candidate, seen_code, index, config.threshold)
                if verdict is not None:
                    _record(state, verdict, progress, report)
                    continue
                screening[screener.submit(candidate.code, candidate.id)] = (candidate, match)
            progress.screening = len(screening)
            if not composing and not screening:
                break
            done, _ = wait([*composing, *screening], return_when=FIRST_COMPLETED)
            for future in done:
                if future in composing:
                    i = composing.pop(future)
                    try:
                        candidate = future.result()
                    except ComposeError as exc:
                        retries[i] += 1
                        if retries[i] <= _COMPOSE_RETRIES:
                            composing[composer_pool.submit(composer.compose, i)] = i
                        else:
                            notes.append(f"candidate {i} was not composed: {exc} (a rerun tries again)")
                        continue
                    state.add_candidate(candidate)
                    progress.composed += 1
                    heapq.heappush(ready, (candidate.index, candidate))
                else:
                    candidate, match = screening.pop(future)
                    screened = future.result()
                    verdict = Verdict(index=candidate.index, stage="filter", kept=screened.kept,
                                      reasons=screened.reasons, match=match, screening=screened)
                    _record(state, verdict, progress, report)
        aborted = False
    finally:
        composer_pool.shutdown(wait=not aborted, cancel_futures=True)
        screener.close(abort=aborted)


def _judge_statically(candidate: Candidate, seen_code: dict[str, int], index: EvalIndex,
                      threshold: float) -> tuple[Verdict | None, Match | None]:
    """The verdicts that need no process: composing failed, a duplicate, contaminated."""
    if candidate.code is None or candidate.error:
        return Verdict(candidate.index, "compose", False, [f"composing failed: {candidate.error}"]), None
    digest = hashlib.sha256(candidate.code.encode()).hexdigest()
    first = seen_code.setdefault(digest, candidate.index)
    if first != candidate.index:
        return Verdict(candidate.index, "duplicate", False, [f"the same code as candidate {first}"]), None
    match = index.nearest(candidate.id, candidate.code)
    if match.similarity > threshold:
        reason = f"AST similarity {match.similarity:.3f} to {match.nearest} (above {threshold:g})"
        return Verdict(candidate.index, "decontam", False, [reason], match=match), match
    return None, match


def _record(state: _State, verdict: Verdict, progress: SynthProgress, report: Callable[[SynthProgress], None]) -> None:
    state.add_verdict(verdict)
    progress.judged += 1
    if verdict.kept:
        progress.kept += 1
    elif verdict.stage == "decontam":
        progress.dropped += 1
    else:
        progress.rejected += 1
    what = "kept" if verdict.kept else f"{verdict.stage}: {verdict.reasons[0] if verdict.reasons else 'rejected'}"
    progress.event = f"synthetic/{verdict.index}: {what}"
    report(progress)


def _finish(config: SynthConfig, state: _State, notes: list[str]) -> SynthSummary:
    """Write the output, the decontamination histogram and dropped list, and the summary."""
    kept_indices = sorted(i for i, v in state.verdicts.items() if v.kept)[:config.count]
    tasks = [_output_task(config, state.candidates[i], state.verdicts[i]) for i in kept_indices]
    write_records(tasks, config.out)
    matches = [v.match for _, v in sorted(state.verdicts.items()) if v.match is not None]
    dropped = [v.match for _, v in sorted(state.verdicts.items()) if v.stage == "decontam" and v.match is not None]
    dropped_list = write_dropped(dropped, state.dir / "dropped.jsonl")
    histogram: Path | None = state.dir / "similarity.png"
    why_not = write_histogram([m.similarity for m in matches], config.threshold, histogram,
                              title=f"{len(matches)} candidates vs {config.eval_name or 'the evaluation set'}")
    if why_not:
        notes.append(f"no similarity histogram: {why_not}")
        histogram = None
    reasons: Counter[str] = Counter()
    for verdict in state.verdicts.values():
        for reason in verdict.reasons:
            reasons[_reason_kind(reason)] += 1
    seconds = [v.screening.seconds for v in state.verdicts.values() if v.screening is not None]
    summary = SynthSummary(
        out=config.out, work_dir=state.dir, count=config.count, written=len(tasks), candidates=len(state.candidates),
        by_stage=dict(Counter("kept" if v.kept else v.stage for v in state.verdicts.values())),
        reasons=dict(reasons.most_common()), stats=composition_stats(tasks), histogram=histogram,
        dropped_list=dropped_list, notes=list(dict.fromkeys(notes)),
        screen_seconds={"screened": len(seconds), "median": round(statistics.median(seconds), 3) if seconds else 0.0,
                        "total": round(sum(seconds), 3)})
    (state.dir / "summary.json").write_text(json.dumps(summary.to_record(), indent=2) + "\n")
    return summary


def _reason_kind(reason: str) -> str:
    """A reason without its numbers, to count reasons by kind."""
    for prefix in ("too fast", "too slow", "not deterministic", "AST similarity", "the same code as", "composing failed",
                   "torch.compile(Model) disagrees"):
        if reason.startswith(prefix):
            return prefix
    return reason.split(":")[0]


def _output_task(config: SynthConfig, candidate: Candidate, verdict: Verdict) -> Task:
    import torch

    screening = verdict.screening
    provenance = {
        **candidate.provenance,
        "device": config.filter.device, "device_name": screening.device_name if screening else "",
        "eager_ms": screening.eager_ms if screening else None,
        "similarity": round(verdict.match.similarity, 6) if verdict.match else None,
        "nearest_eval_task": verdict.match.nearest if verdict.match else None,
        "eval_set": config.eval_name, "torch": torch.__version__, "python": platform.python_version(),
    }
    task = candidate.task()
    return Task(id=task.id, code=task.code, source="synthetic", name=task.name,
                metadata={"ops": candidate.ops, "data_source": candidate.data_source, "provenance": provenance})
