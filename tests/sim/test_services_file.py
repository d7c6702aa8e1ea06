"""The simulator with a services file (issue 19 part 2): inference rows name the file's
services, each service's spec gives its cold start, concurrency and replica cap.

Every workload and services file here is written by the test. The tiny application
of ``test_inference_builders`` trains; services are labels.
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_inference_builders import Greedy, TinyApp, job

from deepboot.core import ClusterSpec, InferenceTaskSpec, Workload
from deepboot.core.errors import ConfigError, InputError
from deepboot.core.gpu import GpuState
from deepboot.core.service import ServiceSpec
from deepboot.perf.restart import FlatRestartCost
from deepboot.policies import inference
from deepboot.scheduler import Event
from deepboot.sim.config import DEEPBOOT_COLD_START, SimConfig
from deepboot.sim.engine import Simulation
from deepboot.sim.metrics import SimResult
from deepboot.sim.run import simulate
from deepboot.sim.services import ServicesFile, bind_services, read_services_file
from deepboot.sim.workload import DEEPBOOT_COLUMNS, load_workload

HEADER = ",".join(DEEPBOOT_COLUMNS)
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def services_toml(*services: dict[str, object]) -> str:
    """A services file's text: one ``[[service]]`` table per dict (values as TOML)."""
    out = []
    for s in services:
        out.append("[[service]]")
        for key, value in s.items():
            out.append(f"{key} = {value!r}".replace("'", '"'))
        out.append("")
    return "\n".join(out)


CHAT = {"name": "chat", "model": "llama-7b", "cold_start_s": 20.0}
IMG = {"name": "img.v2", "model": "sd-xl", "cold_start_s": 5.0, "concurrency": 3}


# -- the loader ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rows", "services", "expect"),
    [
        (["t,1,infer-chat,1,1,2.5,7"], [CHAT], ("chat", "llama-7b")),
        (["t,1,infer-img.v2,1,1,2.5,7"], [CHAT, IMG], ("img.v2", "sd-xl")),
        # the whole rest after "infer-" names the service, dashes and digits included
        (["t,1,infer-bert-1,1,1,2.5,7"], [{**CHAT, "name": "bert-1", "model": "bert"}],
         ("bert-1", "bert")),
        # without a file: today's infer-<model>-<k>, model from the catalog
        (["t,1,infer-bert-1,1,1,2.5,7"], None, ("infer-bert-1", "bert")),
    ],
    ids=["one-service", "second-service", "dashes", "no-file"],
)  # fmt: skip
def test_inference_rows_name_a_service_of_the_file(
    tmp_path: Path,
    rows: list[str],
    services: list[dict[str, object]] | None,
    expect: tuple[str, str],
) -> None:
    csv = write(tmp_path, "w.csv", "\n".join([HEADER, "j,0,tiny,1,100,0,-1", *rows]) + "\n")
    table = None
    if services is not None:
        table = read_services_file(write(tmp_path, "s.toml", services_toml(*services)))
    w = load_workload(csv, ["tiny", "bert"], services=table)
    [t] = w.inference
    assert (t.service, t.model, t.duration, t.num_task) == (*expect, 2.5, 7)
    assert [s.name for s in w.services] == ([] if services is None else [expect[0]])


@pytest.mark.parametrize(
    ("row", "services", "where", "field", "words"),
    [
        # a service the file lacks: the workload's line, column application
        ("t,1,infer-nope,1,1,2.5,7", [CHAT], "w.csv:3", "application",
         "'nope' is not a service of"),
        # an infer-<model>-<k> row is a service name too once a file is given
        ("t,1,infer-bert-1,1,1,2.5,7", [CHAT], "w.csv:3", "application",
         "'bert-1' is not a service of"),
        # no file: the model must be in the catalog, as today
        ("t,1,infer-chat-1,1,1,2.5,7", None, "w.csv:3", "application", "unknown model 'chat'"),
        ("t,1,infer-chat,1,1,2.5,7", None, "w.csv:3", "application",
         "unknown model 'infer-chat'"),
        # a used service without cold_start_s: the services file, its header line
        ("t,1,infer-chat,1,1,2.5,7", [IMG, {"name": "chat", "model": "m"}], "s.toml:7",
         "cold_start_s", "simulator needs one"),
        ("t,1,infer-chat,2,1,2.5,7", [CHAT], "w.csv:3", "num_replicas", "must be 1"),
        ("t,1,infer-chat,1,1,0,7", [CHAT], "w.csv:3", "duration", "must be positive"),
    ],
    ids=["unknown-service", "old-style-row", "no-file-unknown-model", "no-file-no-k",
         "no-cold-start", "replicas", "zero-duration"],
)  # fmt: skip
def test_a_bad_inference_row_names_the_file_line_and_column(
    tmp_path: Path,
    row: str,
    services: list[dict[str, object]] | None,
    where: str,
    field: str,
    words: str,
) -> None:
    csv = write(tmp_path, "w.csv", "\n".join([HEADER, "j,0,tiny,1,100,0,-1", row]) + "\n")
    table = None
    if services is not None:
        table = read_services_file(write(tmp_path, "s.toml", services_toml(*services)))
    with pytest.raises(InputError) as exc:
        load_workload(csv, ["tiny", "bert"], services=table)
    path, _, line = where.partition(":")
    assert (exc.value.path, exc.value.line, exc.value.field) == (
        str(tmp_path / path),
        int(line),
        field,
    )
    assert words in exc.value.message


def test_an_unused_service_needs_no_cold_start(tmp_path: Path) -> None:
    text = services_toml(CHAT, {"name": "idle", "model": "m"})
    csv = write(tmp_path, "w.csv", f"{HEADER}\nj,0,tiny,1,100,0,-1\nt,1,infer-chat,1,1,1,1\n")
    w = load_workload(csv, ["tiny"], services=read_services_file(write(tmp_path, "s.toml", text)))
    assert [s.name for s in w.services] == ["chat"]


def test_a_pollux_header_infer_row_hints_at_the_deepboot_header(tmp_path: Path) -> None:
    csv = write(
        tmp_path, "w.csv", "name,time,application,num_replicas,batch_size\nt,1,infer-chat,1,1\n"
    )
    table = read_services_file(write(tmp_path, "s.toml", services_toml(CHAT)))
    with pytest.raises(InputError, match="need the DeepBoot header"):
        load_workload(csv, ["tiny"], services=table)


def test_a_bad_services_file_names_its_line_and_key(tmp_path: Path) -> None:
    path = write(tmp_path, "s.toml", services_toml(CHAT, {**IMG, "concurrency": 0}))
    with pytest.raises(InputError) as exc:
        read_services_file(path)
    assert (exc.value.path, exc.value.line, exc.value.field) == (str(path), 6, "concurrency")


def test_a_workload_with_services_pickles_whole(tmp_path: Path) -> None:
    """Compare sends loaded workloads to worker processes."""
    text = services_toml({**IMG, "name": "chat"})
    csv = write(tmp_path, "w.csv", f"{HEADER}\nj,0,tiny,1,100,0,-1\nt,1,infer-chat,1,1,1,1\n")
    w = load_workload(csv, ["tiny"], services=read_services_file(write(tmp_path, "s.toml", text)))
    assert pickle.loads(pickle.dumps(w)) == w


def test_bind_services_takes_the_files_specs_for_the_workloads_services(tmp_path: Path) -> None:
    w = workload([task("a", 0.0, 1.0, "chat", "old-label")])
    table = read_services_file(write(tmp_path, "s.toml", services_toml(CHAT, IMG)))
    bound = bind_services(w, table)
    assert bound.services == (ServiceSpec("chat", "llama-7b", cold_start_s=20.0),)
    assert bound.inference[0].model == "llama-7b"
    with pytest.raises(InputError, match="no service 'img'"):
        bind_services(workload([task("a", 0.0, 1.0, "img", "m")]), table)


# -- the simulation -----------------------------------------------------------------------


def task(
    name: str, submit: float, duration: float, service: str, model: str = "m"
) -> InferenceTaskSpec:
    return InferenceTaskSpec(name, submit, service, model, duration, 1)


def workload(
    tasks: Sequence[InferenceTaskSpec],
    services: Sequence[ServiceSpec] = (),
    jobs: int = 1,
) -> Workload:
    return Workload(
        "w",
        tuple(job(f"j{i}", 0.0) for i in range(jobs)),
        tuple(sorted(tasks, key=lambda t: t.submit_time)),
        tuple(services),
    )


def sim(w: Workload, shape: str = "2x2", on_event: object = None, **config: object) -> SimResult:
    """Greedy training on the tiny app; ATS-I; the inference pool is the last node."""
    return simulate(
        w,
        ClusterSpec.parse(shape, 1),
        Greedy(),  # type: ignore[arg-type]
        {"tiny": TinyApp()},
        SimConfig(restart=FlatRestartCost(30.0), check_invariants=True, **config),  # type: ignore[arg-type]
        inference_policy=inference.create("ats-i", use_training_pool=False),
        on_event=on_event,  # type: ignore[arg-type]
    )


def spec(name: str = "chat", concurrency: int = 1, cold: float = 10.0, cap: int = 0) -> ServiceSpec:
    return ServiceSpec(name, "m", concurrency=concurrency, cold_start_s=cold, max_replicas=cap)


@pytest.mark.parametrize(
    ("concurrency", "starts", "colds"),
    [
        # two overlapping tasks, one replica of two slots: one cold start; the second
        # task joins the loading replica and starts with it
        (2, [20.0, 20.0], 1),
        # one slot: the second task starts a replica of its own
        (1, [20.0, 22.0], 2),
    ],
    ids=["concurrency-2", "concurrency-1"],
)
def test_overlapping_tasks_share_a_replica_up_to_its_concurrency(
    concurrency: int, starts: list[float], colds: int
) -> None:
    w = workload(
        [task("a", 10.0, 30.0, "chat"), task("b", 12.0, 30.0, "chat")],
        [spec(concurrency=concurrency)],
    )
    res = sim(w)
    assert [r.start for r in res.inference] == starts
    s = res.summary("greedy", "w")["inference"]
    assert (s["cold_starts"], s["warm_hits"]) == (colds, 2 - colds)


def test_a_replica_protects_only_once_it_serves_nothing() -> None:
    """a: 0..40 (cold start 10 s), b joins at 15 and ends at 25; the replica stays
    RUNNING until a ends, then PROTECT; c at 60 reuses it warm."""
    seen: list[tuple[float, GpuState]] = []

    def spy(now: float, event: Event, s: Simulation) -> None:
        seen.append((now, s.board.get((1, 0)).state))

    w = workload(
        [task("a", 0.0, 30.0, "chat"), task("b", 15.0, 10.0, "chat"), task("c", 60.0, 1.0, "chat")],
        [spec(concurrency=2)],
    )
    res = sim(w, shape="2x1", on_event=spy)
    assert [(r.start, r.end, r.cold) for r in res.inference] == [
        (10.0, 40.0, True),
        (15.0, 25.0, False),
        (60.0, 61.0, False),
    ]
    assert dict(seen)[25.0] is GpuState.RUNNING
    assert dict(seen)[40.0] is GpuState.PROTECT


def test_a_full_replica_overflows_to_a_new_one_up_to_max_replicas() -> None:
    """Three tasks at once, two slots per replica: the third starts a second replica;
    with max_replicas = 1 it waits for a slot instead."""
    tasks = [task(n, 0.0, 50.0, "chat") for n in "abc"]
    free = sim(workload(tasks, [spec(concurrency=2)]), shape="3x2")
    assert [r.start for r in free.inference] == [10.0, 10.0, 10.0]
    assert free.summary("g", "w")["inference"]["cold_starts"] == 2
    capped = sim(workload(tasks, [spec(concurrency=2, cap=1)]), shape="3x2")
    assert [r.start for r in capped.inference] == [10.0, 10.0, 60.0]
    assert capped.summary("g", "w")["inference"]["cold_starts"] == 1


@pytest.mark.parametrize(
    ("concurrency", "tasks", "expect"),
    [
        # R1 (a, b) is loaded with a free slot once b ends at 40; R2 (c) is idle from
        # 20. d at 45 joins R1 rather than waking R2.
        (2, [("a", 0, 90), ("b", 0, 30), ("c", 0, 10), ("d", 45, 5)],
         {"a": (10, True, "R1"), "b": (10, False, "R1"), "c": (10, True, "R2"),
          "d": (45, False, "R1")}),
        # R2 (x, y, q) is full while z cold-starts R1 at 12 (ready at 22). R2 is idle
        # from 15: v at 16 wakes it warm rather than wait for R1's slot.
        (3, [("x", 0, 5), ("y", 0, 5), ("q", 0, 5), ("z", 12, 50), ("v", 16, 1)],
         {"x": (10, True, "R2"), "y": (10, False, "R2"), "q": (10, False, "R2"),
          "z": (22, True, "R1"), "v": (16, False, "R2")}),
        # w at 14 finds R2 full and R1 loading: it waits for R1's slot (start 22)
        # rather than cold-start a third replica.
        (2, [("x", 0, 5), ("y", 0, 5), ("z", 12, 50), ("w", 14, 1)],
         {"x": (10, True, "R2"), "y": (10, False, "R2"), "z": (22, True, "R1"),
          "w": (22, False, "R1")}),
    ],
    ids=["join-a-loaded-replica", "warm-before-a-loading-slot", "loading-slot-before-cold"],
)  # fmt: skip
def test_which_replica_a_task_joins(
    concurrency: int,
    tasks: list[tuple[str, int, int]],
    expect: dict[str, tuple[int, bool, str]],
) -> None:
    gpus: dict[str, tuple[int, int]] = {}

    def spy(now: float, event: Event, s: Simulation) -> None:
        assert s.serving is not None
        for name, t in s.serving.tasks.items():
            if t.gpu is not None:
                gpus.setdefault(name, t.gpu)

    w = workload(
        [task(n, float(at), float(d), "chat") for n, at, d in tasks],
        [spec(concurrency=concurrency)],
    )
    res = sim(w, shape="3x2", on_event=spy)
    got = {r.name: (r.start, r.cold) for r in res.inference}
    assert got == {n: (float(st), cold) for n, (st, cold, _) in expect.items()}
    groups: dict[str, set[tuple[int, int]]] = {}
    for n, (_, _, replica) in expect.items():
        groups.setdefault(replica, set()).add(gpus[n])
    assert all(len(g) == 1 for g in groups.values())
    assert len({next(iter(g)) for g in groups.values()}) == len(groups)


def test_concurrency_1_from_a_file_equals_no_file(tmp_path: Path) -> None:
    """The shipped DeepBoot demo, its services given by a services file with the
    per-model cold starts and concurrency 1: the same summary and records (but the
    services' names) as without the file."""
    rows = (EXAMPLES / "demo-deepboot.csv").read_text().splitlines()
    keep = [rows[0], *[r for r in rows[1:] if "infer-" not in r][:6]]
    keep += [r for r in rows[1:] if "infer-" in r][:400]
    csv = write(tmp_path, "demo.csv", "\n".join(keep) + "\n")
    names = sorted({r.split(",")[2] for r in keep[1:] if "infer-" in r})
    text = services_toml(
        *(
            {"name": n[len("infer-") :], "model": n.split("-")[1],
             "cold_start_s": DEEPBOOT_COLD_START[n.split("-")[1]], "concurrency": 1}
            for n in names
        )
    )  # fmt: skip
    from deepboot.perf.catalog import load_catalog
    from deepboot.policies import registry

    apps = load_catalog()
    limits = {n: a.limits for n, a in apps.items()}
    plain = load_workload(csv, apps.keys(), limits)
    filed = load_workload(
        csv, apps.keys(), limits, read_services_file(write(tmp_path, "s.toml", text))
    )
    assert plain.services == () and len(filed.services) == len(names)
    results = []
    for w in (plain, filed):
        results.append(
            simulate(
                w,
                ClusterSpec.parse("4x4", 2),
                registry.create("deepboot"),
                apps,
                SimConfig(interval=60.0),
            )
        )
    a, b = (r.summary("deepboot", "demo") for r in results)
    for s in (a, b):
        s.pop("wall_s", None)
        s.get("scheduler", {}).pop("decision_ms", None)
        s["scheduler"] = {k: v for k, v in s["scheduler"].items() if "ms" not in k}
        # Keyed by the services' names, which differ: compare them in order.
        s["inference"]["per_service"] = list(s["inference"]["per_service"].values())
    assert a == b
    assert a["inference"]["tasks"] == 400
    strip = [
        dataclasses.replace(r, service=r.service[len("infer-") :]) for r in results[0].inference
    ]
    assert strip == list(results[1].inference)
    assert results[0].jobs == results[1].jobs


def test_service_specs_refuse_a_service_missing_from_the_given_ones() -> None:
    from deepboot.sim.serving import service_specs

    tasks = [task("a", 0.0, 1.0, "chat")]
    with pytest.raises(ConfigError, match="not among the workload's services"):
        service_specs(tasks, lambda m: 1.0, [spec("other")])
    with pytest.raises(ConfigError, match="has no cold_start_s"):
        service_specs(tasks, lambda m: 1.0, [ServiceSpec("chat", "m")])
    assert service_specs(tasks, lambda m: 1.0, [spec()])["chat"] == spec()


# -- the invariant ------------------------------------------------------------------------

_tasks = st.lists(
    st.tuples(
        st.sampled_from(["chat", "img", "solo"]),
        st.integers(0, 120),  # submit
        st.integers(1, 60),  # duration
    ),
    min_size=1,
    max_size=25,
)


@settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    _tasks,
    st.integers(1, 4),
    st.integers(0, 3),
    st.sampled_from(["ats-i", "random", "lyra"]),
)
def test_no_replica_ever_serves_more_than_its_concurrency(
    rows: list[tuple[str, int, int]], concurrency: int, cap: int, policy: str
) -> None:
    """Counted from the tasks themselves after every event: a GPU's placed, unfinished
    tasks are all of one service, at most its concurrency, and the GPU is RUNNING."""
    specs = [spec("chat", concurrency, 7.0, cap), spec("img", 2, 3.0), spec("solo", 1, 5.0)]
    by_name = {s.name: s for s in specs}
    w = workload(
        [task(f"t{i}", float(t), float(d), s) for i, (s, t, d) in enumerate(rows)],
        specs,
        jobs=2,
    )
    peak: dict[str, int] = {}

    def check(now: float, event: Event, s: Simulation) -> None:
        assert s.serving is not None
        on: dict[tuple[int, int], list[str]] = {}
        for t in s.serving.tasks.values():
            if t.gpu is not None and not t.done:
                on.setdefault(t.gpu, []).append(t.spec.service)
        for gpu, services in on.items():
            assert len(set(services)) == 1, (now, gpu, services)
            assert len(services) <= by_name[services[0]].concurrency, (now, gpu, services)
            assert s.board.get(gpu).state is GpuState.RUNNING
            peak[services[0]] = max(peak.get(services[0], 0), len(services))
        if cap:
            loaded = [g for g in s.board.gpus if g.service == "chat"]
            assert len(loaded) <= cap

    res = simulate(
        w,
        ClusterSpec.parse("3x2", 2),
        Greedy(),  # type: ignore[arg-type]
        {"tiny": TinyApp()},
        SimConfig(restart=FlatRestartCost(30.0), check_invariants=True),
        inference_policy=inference.create(policy),
        on_event=check,
    )
    assert all(r.end is not None for r in res.inference)  # every task was served
    assert peak.get("solo", 0) <= 1


def test_services_file_of_the_sim_is_read_once(tmp_path: Path) -> None:
    """A pipe can be read once only: the file's text and specs come from one read."""
    path = write(tmp_path, "s.toml", services_toml(CHAT, IMG))
    table = read_services_file(path)
    assert isinstance(table, ServicesFile)
    assert list(table.specs) == ["chat", "img.v2"] and dict(table.lines) == {"chat": 1, "img.v2": 6}


def test_a_workload_read_without_the_file_binds_to_it_like_one_read_with_it(
    tmp_path: Path,
) -> None:
    """``simulate(load_workload(w), services=f)`` names the services as
    ``load_workload(w, services=f)`` does ("infer-ncf-1" -> "ncf-1")."""
    import deepboot

    demo = Path(__file__).resolve().parents[2] / "examples" / "demo-deepboot.csv"
    plain = deepboot.load_workload(demo)
    names = sorted({t.service.removeprefix("infer-") for t in plain.inference})
    services = tmp_path / "s.toml"
    services.write_text(
        "".join(f'[[service]]\nname = "{n}"\nmodel = "m"\ncold_start_s = 5.0\n\n' for n in names)
    )
    shape = deepboot.cluster("4x4", inference_nodes=2)
    late = deepboot.simulate(plain, shape, policy="deepboot", max_time=3600, services=services)
    early = deepboot.simulate(
        deepboot.load_workload(demo, services=services), shape, policy="deepboot", max_time=3600
    )
    assert late.summary["inference"] == early.summary["inference"]
    assert late.summary["training"] == early.summary["training"]
