"""Clips on Ray: one actor per worker loads the model once; the driver hands each a clip when it is free.

Placement: an actor asks for what its backend needs (`worker_resources`): `num_gpus` 1 for CUDA, one unit of
the custom resource `tenstorrent` for ttnn (start such nodes with `ray start --resources '{"tenstorrent": 1}'`)
and CPUs otherwise, so a mixed cluster puts each worker where its device is.

Faults: Ray restarts an actor whose process died (`max_restarts=-1`) and re-runs the task it was running
(`max_task_retries`) on the new process; after `max_retries` deaths the clip is recorded as failed. A task is
resolved once, and the driver alone writes result files, so a retried clip is never counted twice. An
exception inside a clip is not a death: the evaluator returns it as a failed record.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from alpamayo.errors import BackendUnavailable
from alpamayo.eval.clips import Clip
from alpamayo.eval.evaluator import ClipEvaluator
from alpamayo.eval.results import failed_record
from alpamayo.eval.settings import LOCAL_RAY, EvalSettings

TENSTORRENT = "tenstorrent"  # the custom resource a node with a Blackhole card advertises (one per card)
# The embedded Ray's shared-memory object store: results are a few hundred kB per clip, and the machine's
# memory belongs to the model (Ray's default takes 30% of RAM).
LOCAL_OBJECT_STORE_BYTES = 256 * 1024**2
CLOSE_TIMEOUT_S = 60.0


@dataclass
class WorkerPool:
    """What the Ray run used: each worker's ready() answer and the clips' wall time (s)."""

    workers: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0


def import_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise BackendUnavailable(
            f"--ray needs the `ray` package ({e}); without --ray clips run in-process"
        ) from e
    return ray


def start_local_ray(
    ray: Any, num_cpus: int | None = None, object_store_bytes: int = LOCAL_OBJECT_STORE_BYTES
) -> None:
    """An embedded Ray with a small footprint: `num_cpus` (None: all), no dashboard, a small object store, the
    workers' logs kept out of this terminal (the progress bar and report are the output)."""
    ray.init(
        num_cpus=num_cpus,
        include_dashboard=False,
        object_store_memory=object_store_bytes,
        logging_level="WARNING",
        log_to_driver=False,
    )


def connect(ray: Any, address: str) -> bool:
    """Join `address` (or start an embedded Ray for LOCAL_RAY); True when this call started Ray (and so
    stops it). A process that already called ray.init keeps its connection."""
    if ray.is_initialized():
        return False
    if address == LOCAL_RAY:
        start_local_ray(ray)
    else:
        try:
            ray.init(address=address, logging_level="WARNING", log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise ValueError(f"--ray {address}: cannot join the Ray cluster: {e}") from None
    return True


def worker_resources(settings: EvalSettings, cluster: dict[str, float]) -> tuple[int, dict[str, Any]]:
    """(workers, actor options) for `settings` on a cluster with `cluster` resources (ray.cluster_resources());
    ValueError when the cluster lacks what one worker needs."""
    model = settings.model
    if model.backend == "ttnn":
        kind, need = TENSTORRENT, {"num_cpus": 1, "resources": {TENSTORRENT: 1}}
    elif model.device.startswith("cuda"):
        kind, need = "GPU", {"num_cpus": 1, "num_gpus": 1}
    else:
        kind, need = "CPU", {}
    have = int(cluster.get(kind, 0))
    if kind == "CPU":
        workers = settings.workers or 1
        cpus = settings.cpus_per_worker or max(1, have // workers)
        need = {"num_cpus": cpus}
        capacity = have // cpus
    else:
        workers = settings.workers or have
        capacity = have
    if capacity < 1 or workers > capacity:
        hint = f" (start nodes with --resources '{{\"{TENSTORRENT}\": 1}}')" if kind == TENSTORRENT else ""
        raise ValueError(
            f"--workers {workers} with --backend {model.backend} --device {model.device}: the Ray cluster "
            f"has {have} {kind}{hint}, room for {max(capacity, 0)} worker(s) of {need}"
        )
    return workers, need


def evaluate_on_ray(
    settings: EvalSettings,
    clips: Sequence[Clip],
    on_result: Callable[[Clip, dict[str, Any]], None],
    evaluator: type = ClipEvaluator,
) -> WorkerPool:
    """Evaluate `clips` on Ray (settings.ray), calling `on_result(clip, record)` in the driver for each.

    evaluator: the actor's class, built as evaluator(settings, worker, threads) with ready(), evaluate(item)
    and close() (`ClipEvaluator`; the closed-loop runner's `SceneRunner` runs scenes the same way)."""
    ray = import_ray()
    started = connect(ray, settings.ray)
    try:
        workers, options = worker_resources(settings, ray.cluster_resources())
        workers = min(workers, len(clips))
        actor = ray.remote(max_restarts=-1, max_task_retries=settings.max_retries)(evaluator)
        threads = options["num_cpus"]
        actors = [actor.options(**options).remote(settings, i, threads) for i in range(workers)]
        try:
            pool = WorkerPool(_ready(ray, actors))
            start = time.perf_counter()
            _dispatch(ray, actors, clips, settings.max_retries, on_result)
            pool.wall_s = time.perf_counter() - start
        finally:
            _close(ray, actors)
        return pool
    finally:
        if started:
            ray.shutdown()


def _close(ray: Any, actors: list) -> None:
    """Let each worker release its device (ttnn closes the card), then end the actors."""
    # A dead or stuck worker holds nothing that ray.kill does not release.
    with contextlib.suppress(ray.exceptions.RayError):
        ray.get([a.close.remote() for a in actors], timeout=CLOSE_TIMEOUT_S)
    for a in actors:
        ray.kill(a)


def _ready(ray: Any, actors: list) -> list[dict[str, Any]]:
    """Each worker's ready() answer; a model that fails to load stops the run with the worker's error."""
    try:
        return ray.get([a.ready.remote() for a in actors])
    except ray.exceptions.RayActorError as e:
        cause = getattr(e, "cause", None) or e
        raise ValueError(f"a Ray worker could not load the model: {cause}") from None


def _dispatch(
    ray: Any,
    actors: list,
    clips: Sequence[Clip],
    max_retries: int,
    on_result: Callable[[Clip, dict[str, Any]], None],
) -> None:
    """One clip in flight per actor; a free actor takes the next clip. A task whose retries ran out (its worker
    process died max_retries + 1 times) is the clip's failure; the actor then gets its next clip only once Ray
    has restarted it (a `ready` call, retried until the new process answers: a clip sent to a restarting actor
    fails as unavailable, without running). An actor that cannot come back leaves its clips to the others; with
    none left the remaining clips stay unevaluated (pending in the report, evaluated by a rerun)."""
    queue = deque(clips)
    inflight: dict[Any, tuple[Any, Clip | None]] = {}  # clip None: waiting for the actor's restart

    def submit(a: Any) -> None:
        if queue:
            clip = queue.popleft()
            inflight[a.evaluate.remote(clip)] = (a, clip)

    for a in actors:
        submit(a)
    while inflight:
        (ref,), _ = ray.wait(list(inflight), num_returns=1)
        a, clip = inflight.pop(ref)
        try:
            record = ray.get(ref)
        except ray.exceptions.RayActorError as e:
            if clip is None:
                continue  # the actor is gone for good
            on_result(
                clip,
                failed_record(
                    clip,
                    f"the worker process died {max_retries + 1} time(s) evaluating it (Ray: {type(e).__name__})",
                ),
            )
            inflight[a.ready.options(max_task_retries=-1).remote()] = (a, None)
            continue
        if clip is not None:
            on_result(clip, record)
        submit(a)
