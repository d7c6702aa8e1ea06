"""The runtime's commands: up, down, submit, serve, status, logs, cancel.

Ray and torch are imported only by the processes that need them (the controller and
the workers), so ``submit``, ``status``, ``logs`` and ``cancel`` are quick.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from deepboot.cli.policy_params import POLICY_HELP, add_shared_cluster_flags
from deepboot.core.cluster import ClusterSpec
from deepboot.core.errors import ConfigError
from deepboot.runtime.client.statusdoc import status_document
from deepboot.runtime.store.statedir import STATE_DIR_HELP, StateDir
from deepboot.world.presets import DEFAULT_PRESET

if TYPE_CHECKING:
    from deepboot.runtime.store.jobstore import JobStore

_UP_EPILOG = """\
Without --policy, up runs the preset guarded (see 'deepboot policies'): ATS-T with
Pollux's objective (deepboot, objective=power-mean, restart_delay=30, hysteresis=0.05,
solver=core), the SLO guard, a 1 GB host-memory model cache per inference node and
30 s rounds, the best configuration measured (simulator, 16x4 GPUs with 8 inference
nodes: 0.99x the all-GPU average JCT on small.csv and 1.07x on middle.csv, 99.8% of
requests within a 1 s wait; the paper's deepboot keeps 45% on small.csv). Flags and
--param given beside it win over its own (--interval 5, --host-cache-gb 8);
--reserve or --no-lending replace its guard. The host cache gains only for handlers
that export and restore their weights (docs/runtime.md); raise --host-cache-gb to your
models' sizes.

examples:
  # a laptop: 2 training and 2 inference nodes of 2 logical GPUs (torch on the CPU)
  deepboot up --training-nodes 2 --inference-nodes 2 --gpus-per-node 2

  # the paper's DeepBoot (ATS-T, ATS-I, AFE) instead, as the reproductions run it
  deepboot up --inference-nodes 2 --policy deepboot

  # fast timings for a demo or a test
  deepboot up --training-nodes 2 --gpus-per-node 2 --interval 5 --poll 0.5

  # attach to an existing Ray cluster: nodes labelled deepboot.io/pool (KubeRay,
  # examples/kuberay/), or carrying deepboot's resources (docs/runtime.md)
  deepboot up --address 10.0.0.1:6379 --ray-token /etc/deepboot/ray-token

  # serve requests on every interface
  deepboot up --inference-nodes 2 --http-host 0.0.0.0

  # keep back from lending the idle replicas the last 2 minutes of requests say the
  # next arrivals will need (fewer reclaims; the simulator's --reserve)
  deepboot up --inference-nodes 2 --reserve --reserve-window 120

  # SLO-guarded lending: forecast each service's requests, hold and pre-warm the
  # replicas its slo_target needs (guaranteed_replicas are held whatever the flags)
  deepboot up --inference-nodes 2 --slo --slo-target 0.95

The shared-cluster flags are deepboot simulate's, with the same meaning and checks
(--afe: keep-alive resizes, on by default here; --no-afe: checkpoint and restart).
--warm-pool and --oracle are refused: they are simulator references that read the
whole workload ahead.

  # then (the header file keeps the token off curl's command line, where ps would
  # show it to every user; the state directory is ~/.local/state/deepboot/default
  # unless --state-dir or $XDG_STATE_HOME say otherwise)
  curl -H @$HOME/.local/state/deepboot/default/http-header \
       http://127.0.0.1:8470/v1/services

The local cluster listens on loopback only, with Ray's token authentication on (the
token is STATE_DIR/ray-token, readable by its owner only); Ray's directory is a new
/tmp/deepboot-ray-XXXXXXXXXXXX of mode 0700. The controller's HTTP endpoint
(requests, job and service submissions, /metrics) is on 127.0.0.1:8470 unless
--http-host/--http-port say otherwise; STATE_DIR/http.json records it. Every request
but GET /healthz needs the bearer token of STATE_DIR/http-token, on loopback too;
STATE_DIR/http-header holds the whole header (mode 0600) for curl -H @FILE. POST
bodies are JSON, sent with Content-Type: application/json (anything else: 415).
Policies: the ones that need nothing a real cluster does not know (deepboot, pollux,
tiresias, fifo, ...);
optimus, afs and lyra read each job's remaining work and are refused."""

_SUBMIT_EPILOG = """\
example job file (paths are relative to it):
  name = "regression-a"
  entry = "regression.py:train"
  min_workers = 1
  max_workers = 4
  batch_size = 32
  max_batch_size = 512
  max_local_batch_size = 128
  [args]
  loss_threshold = 0.01

or your own torchrun script, unmodified (a command job: restarted at every
resize; it resumes from its own checkpoint in {checkpoint_dir}):
  name = "ddp-train"
  command = ["python", "ddp_train.py", "--checkpoint-dir", "{checkpoint_dir}"]
  min_workers = 1
  max_workers = 3
  batch_size = 24          # the script's own global batch
  application = "cifar10"  # optional: a catalog model as its prior
  # profile = "scalability.csv"  # or its own measured step times as the prior
  max_restarts = 3         # failures restarted (1, 2, 4 ... 60 s apart)
  stop_grace_s = 10        # SIGTERM, then SIGKILL

See examples/runtime/ and docs/runtime.md ("Bring your own script") for both."""


_SERVE_EPILOG = """\
example service file (paths are relative to it):
  name = "echo"
  model = "tiny-mlp"
  handler = "echo_service.py:load"   # factory(device, **args) -> handler(body) -> answer
  concurrency = 1                    # requests in flight per replica
  max_replicas = 4                   # 0: no cap
  queue_bound = 64                   # waiting requests, then 503 + Retry-After
  request_timeout_s = 30
  [args]
  hidden = 64

then: curl -X POST -H @STATE_DIR/http-header -H 'Content-Type: application/json' \\
        -H 'X-Request-Id: r1' -d '{"x": [1, 2]}' http://127.0.0.1:8470/v1/echo/infer
(STATE_DIR/http-header: the bearer token's header, mode 0600; the body must be JSON,
sent as application/json, else 415). See examples/runtime/ and docs/runtime.md.

or your own model server (vLLM, TGI, Triton: a command service, proxied):
  name = "chat"
  model = "meta-llama/Llama-3.1-8B-Instruct"
  command = ["vllm", "serve", "{model}", "--port", "{port}", "--enable-sleep-mode"]
  ready_path = "/health"             # polled until 200 before it takes requests
  sleep = { method = "POST", path = "/sleep?level=1", timeout_s = 30 }  # when lent
  wake = { method = "POST", path = "/wake_up", timeout_s = 60 }          # reclaimed
  gpus_per_replica = 1               # vLLM's --tensor-parallel-size
  [env]
  VLLM_SERVER_DEV_MODE = "1"         # vLLM serves /sleep and /wake_up only with it
then an OpenAI client's base URL is http://127.0.0.1:8470/v1/chat/v1, its API key
the token. See docs/inference-servers.md (the stand-in server examples/runtime/
standin.toml runs here without a GPU).

Several services in one file (the services file 'deepboot simulate --services'
reads; here every service needs a handler):
  [[service]]
  name = "echo"
  model = "tiny-mlp"
  handler = "echo_service.py:load"
  cold_start_s = 2.0                 # the simulator's; measured here
  [[service]]
  name = "echo-wide"
  model = "tiny-mlp"
  handler = "echo_service.py:load"
  concurrency = 4
  [service.args]
  hidden = 128"""

_STATUS_EPILOG = """\
examples:
  deepboot status
  deepboot status --json
  deepboot status --watch --every 5

--watch redraws the status every --every seconds until Ctrl-C, fitted to the
terminal's width: the GPUs by node, one line per service and per job, long names
cut with an ellipsis. A controller that is down is shown with its last record; a state directory
that cannot be read (removed by 'deepboot down', say) is a line on the screen, and
the next refresh reads it again."""


def _state_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", default=None, metavar="DIR", help=STATE_DIR_HELP)


def _command(
    sub: Any, formatter: type[argparse.HelpFormatter], name: str, **kwargs: Any
) -> argparse.ArgumentParser:
    """One runtime subcommand, with the --state-dir flag every one of them takes."""
    p: argparse.ArgumentParser = sub.add_parser(name, formatter_class=formatter, **kwargs)
    _state_flag(p)
    return p


def add_parsers(sub: Any, formatter: type[argparse.HelpFormatter]) -> None:
    """Add the runtime's subcommands to the ``deepboot`` parser."""
    up = _command(
        sub,
        formatter,
        "up",
        help="start a Ray cluster (or attach to one) and the scheduler's controller",
        description="Start one Ray node per cluster node on this machine (or attach to a "
        "Ray cluster), and the controller that schedules submitted jobs on it.",
        epilog=_UP_EPILOG,
    )
    up.add_argument("--training-nodes", type=int, default=2, metavar="N")
    up.add_argument("--inference-nodes", type=int, default=0, metavar="N")
    up.add_argument("--gpus-per-node", type=int, default=2, metavar="G")
    up.add_argument(
        "--address",
        metavar="HOST:PORT",
        help="attach to this Ray cluster: its nodes' deepboot.io/pool labels, else their "
        "deepboot_node_<n> resources, say what they are",
    )
    up.add_argument("--ray-token", metavar="FILE", help="the attached cluster's Ray token file")
    up.add_argument(
        "--cuda-devices",
        metavar="LIST",
        help="a local cluster's GPUs on this machine's CUDA devices: one per GPU, node 0's "
        "first, comma-separated positions in the devices CUDA_VISIBLE_DEVICES shows (e.g. "
        "0,1,2,3). Nodes may share a device for one-worker jobs and replicas (0,0: a "
        "training and an inference node of one GPU each on a one-GPU machine; NCCL refuses "
        "two ranks of a job on one device). Default: one device each when the machine has "
        "enough, else every GPU logical (torch on the CPU)",
    )
    up.add_argument(
        "--policy",
        default=None,
        metavar="NAME",
        help=POLICY_HELP + f". Default: {DEFAULT_PRESET} (--policy deepboot: the paper's DeepBoot)",
    )
    add_shared_cluster_flags(up)
    up.add_argument(
        "--interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds between rounds (default 60; a preset's own, e.g. 30 for guarded)",
    )
    up.add_argument("--poll", type=float, default=1.0, help="seconds between worker polls")
    up.add_argument(
        "--collective-timeout",
        type=float,
        default=60.0,
        help="seconds before a hung collective or rendezvous fails (gloo's default is 30 min)",
    )
    up.add_argument("--seed", type=int, default=0, help="seed of the policy's randomness")
    up.add_argument(
        "--keep-events",
        type=int,
        default=1_000_000,
        metavar="N",
        help="the event log's retention: its newest N entries are kept, older ones "
        "dropped (the metrics' counts go on)",
    )
    up.add_argument(
        "--export-timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="with --host-cache-gb: seconds a replica about to be evicted may take to "
        "export its model into its node's cache; then it is evicted anyway (default 5)",
    )
    up.add_argument(
        "--standby-replicas",
        action="store_true",
        help="keep one replica process started ahead of need on each inference node "
        "(imports done, no GPU held until used): a replica that starts there skips its "
        "process start and 'import torch' (1.5-3 s on 2 cores); costs one idle process "
        "(~300 MB with torch) per inference node",
    )
    up.add_argument(
        "--http-host",
        default="127.0.0.1",
        metavar="ADDR",
        help="address of the HTTP endpoint (every request but /healthz needs the bearer "
        "token, on loopback too)",
    )
    up.add_argument(
        "--http-port", type=int, default=8470, metavar="PORT", help="its port (0: any free one)"
    )
    up.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="training policy parameter (see 'deepboot policies'); repeat for several. "
        "For example restart_delay=2: AFE resizes cost seconds, not a restart's minute",
    )
    up.set_defaults(func=cmd_up)

    down = _command(
        sub,
        formatter,
        "down",
        help="stop the controller and the cluster 'up' started",
        description="Stop the controller and what 'deepboot up' started, nothing else. "
        "The job store and logs stay in the state directory.",
    )
    down.set_defaults(func=cmd_down)

    submit = _command(
        sub,
        formatter,
        "submit",
        help="submit a training job (TOML)",
        description="Validate a job file and add the job to the store; the controller "
        "schedules it at its next round.",
        epilog=_SUBMIT_EPILOG,
    )
    submit.add_argument("job_file", metavar="JOB.toml")
    submit.set_defaults(func=cmd_submit)

    serve = _command(
        sub,
        formatter,
        "serve",
        help="register inference services (TOML)",
        description="Validate a service file (or a services file: one [[service]] table "
        "per service) and register its services; requests to POST /v1/<service>/infer "
        "(a handler service) or to /v1/<service>/<path> (a command service: its own "
        "server, e.g. vLLM, proxied; docs/inference-servers.md) then start replicas on "
        "inference GPUs (ATS-I).",
        epilog=_SERVE_EPILOG,
    )
    serve.add_argument("service_file", metavar="SERVICE.toml")
    serve.set_defaults(func=cmd_serve)

    status = _command(
        sub,
        formatter,
        "status",
        help="GPUs by pool and state, services and their replicas, jobs and their lent GPUs",
        description="Show the cluster's GPUs and jobs, from the job store. --json prints "
        "the same for scripts (schema: docs/runtime.md); --watch shows it live.",
        epilog=_STATUS_EPILOG,
    )
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument("--watch", action="store_true", help="a live screen, redrawn until Ctrl-C")
    status.add_argument(
        "--every", type=float, default=argparse.SUPPRESS, metavar="SECONDS",
        help="with --watch: seconds between refreshes (default: 2)",
    )  # fmt: skip
    status.set_defaults(func=cmd_status)

    logs = _command(
        sub,
        formatter,
        "logs",
        help="a job's worker output, or a service's replicas' output, and its events",
        description="Print a job's workers' output (each line prefixed with the job and "
        "the worker's GPU), or a service's replicas' (a command service's server: each "
        "line prefixed with the service and its GPUs), and its entries in the event log.",
    )
    logs.add_argument("job", metavar="JOB|SERVICE")
    logs.add_argument("--tail", type=int, default=0, metavar="N", help="last N lines only")
    logs.set_defaults(func=cmd_logs)

    rep = _command(
        sub,
        formatter,
        "replay",
        help="replay the controller's recorded decisions step by step; name the first that differs",
        description="Feed every step the controller's control loop recorded (the event, "
        "the snapshot it read, its random state) to a loop built from the same settings, "
        "and check that it returns the same operations. With --policy or --param: where "
        "would that policy have decided otherwise on this cluster's own history? Exit "
        "status 1 at the first divergence, which is printed.",
        epilog="examples:\n  deepboot replay\n"
        "  deepboot replay --param restart_delay=120\n"
        "  deepboot replay /var/lib/deepboot",
    )
    rep.add_argument(
        "state", nargs="?", metavar="STATE_DIR", help="the state directory (or --state-dir)"
    )
    rep.add_argument("--policy", help="replay with this training policy instead")
    rep.add_argument(
        "--param", action="append", default=[], metavar="KEY=VALUE",
        help="a training policy parameter to replay with instead; repeat for several",
    )  # fmt: skip
    rep.set_defaults(func=cmd_replay)

    cancel = _command(
        sub,
        formatter,
        "cancel",
        help="cancel a job",
        description="Ask the controller to stop a job's workers and free its GPUs.",
    )
    cancel.add_argument("job", metavar="JOB")
    cancel.set_defaults(func=cmd_cancel)


def _positive(name: str, value: float, integer: bool = True) -> None:
    if not (value > 0) or (integer and value != int(value)) or not math.isfinite(value):
        raise ConfigError(
            f"--{name} must be a positive {'integer' if integer else 'number'}, got {value}"
        )


def cmd_up(args: argparse.Namespace, out: Console, err: Console) -> int:
    from deepboot.cli.policy_params import resolve_policy, shared_cluster, split_pairs
    from deepboot.runtime.cluster.updown import up
    from deepboot.runtime.controller.controller_settings import ControllerSettings, check_runnable
    from deepboot.runtime.store.statedir import check_not_committable

    resolve_policy(args, DEFAULT_PRESET)
    shared = shared_cluster(args)
    check_runnable(shared)
    for name in ("interval", "poll", "collective_timeout"):
        _positive(name.replace("_", "-"), getattr(args, name), integer=False)
    if not 0 <= args.http_port <= 65535:
        raise ConfigError(f"--http-port must be in [0, 65535], got {args.http_port}")
    cluster = None
    if args.address and args.cuda_devices is not None:
        raise ConfigError(
            "--cuda-devices maps a local cluster's GPUs; an attached cluster's node "
            "sees its machine's devices (set CUDA_VISIBLE_DEVICES for its 'ray start')"
        )
    if not args.address:
        _positive("training-nodes", args.training_nodes)
        _positive("gpus-per-node", args.gpus_per_node)
        if args.inference_nodes < 0 or args.training_nodes + args.inference_nodes > 64:
            raise ConfigError("--inference-nodes must be >= 0, and at most 64 nodes in all")
        if args.gpus_per_node > 16:
            raise ConfigError("--gpus-per-node must be at most 16")
        total = args.training_nodes + args.inference_nodes
        cluster = ClusterSpec.parse(f"{total}x{args.gpus_per_node}", args.inference_nodes)
    settings = ControllerSettings(
        policy=args.policy,
        preset=args.preset,
        interval=args.interval,
        poll=args.poll,
        collective_timeout=args.collective_timeout,
        seed=args.seed,
        params=split_pairs(args.param),
        http_host=args.http_host,
        http_port=args.http_port,
        shared=shared,
        keep_events=args.keep_events,
        export_timeout=args.export_timeout,
        standby_replicas=args.standby_replicas,
    )
    state = StateDir.at(args.state_dir)
    check_not_committable(state.root)  # before anything is written there
    restarting = state.cluster_file.exists()
    started = time.monotonic()
    with err.status("starting the cluster ..."):
        record = up(
            state,
            settings,
            cluster,
            args.address,
            Path(args.ray_token) if args.ray_token else None,
            args.cuda_devices,
        )
    state.ensure_http_token()  # and STATE_DIR/http-header, for curl
    gpus = sum(n for _, _, n in record.nodes)
    if restarting:
        out.print(
            f"restarted the controller of the cluster in {state.root} (its settings are "
            "those of the first 'up'); it reconciles with the running workers"
        )
        return 0
    out.print(
        f"deepboot is up ({record.mode}, Ray at {record.address}): {len(record.nodes)} nodes, "
        f"{gpus} GPUs, {settings.describe()}, {'AFE' if settings.afe else 'restart'} "
        f"resizes; state in {state.root} ({time.monotonic() - started:.0f} s)"
    )
    if record.gpus_line:
        out.print(record.gpus_line)
    if state.http_file.exists():
        info = json.loads(state.http_file.read_text())
        out.print(
            f"HTTP endpoint: {info.get('url')} (bearer token: {state.http_token}; "
            f"curl -H @{state.http_header} ...)"
        )
    return 0


def cmd_down(args: argparse.Namespace, out: Console, err: Console) -> int:
    from deepboot.runtime.cluster.updown import down

    state = StateDir.at(args.state_dir)
    out.print(down(state))
    # No controller serves any more: a client must not find an endpoint to trust.
    state.http_file.unlink(missing_ok=True)
    return 0


def _store(args: argparse.Namespace) -> Any:
    from deepboot.runtime.store.jobstore import JobStore

    state = StateDir.at(args.state_dir)
    if not state.db.exists() and not state.cluster_file.exists():
        raise ConfigError(f"no deepboot state in {state.root} (run 'deepboot up' first)")
    state.ensure()
    return JobStore(state.db)


def cmd_submit(args: argparse.Namespace, out: Console, err: Console) -> int:
    from deepboot.runtime.client.jobspec import load_job

    spec = load_job(args.job_file)
    store = _store(args)
    store.submit(spec)
    out.print(f"submitted {spec.name} ({spec.min_workers}-{spec.max_workers} workers)")
    return 0


def cmd_serve(args: argparse.Namespace, out: Console, err: Console) -> int:
    from deepboot.runtime.client.servicespec import load_service_file

    specs = load_service_file(args.service_file)  # every service checked before any is stored
    store = _store(args)
    state = StateDir.at(args.state_dir)
    for spec in specs:
        fresh = store.register_service(spec)
        url = _wait_until_served(state, spec.name)
        route = (
            f"/v1/{spec.name}/<path> (its server's /<path>)"
            if spec.is_command
            else (f"/v1/{spec.name}/infer")
        )
        where = f" at {url}{route}" if url else " (the controller takes it up when it runs)"
        cap = spec.max_replicas or "no cap"
        out.print(
            f"{'registered' if fresh else 'already registered:'} service {spec.name} "
            f"({spec.concurrency} in flight per replica, replicas {cap}){where}"
        )
    return 0


def _wait_until_served(state: StateDir, service: str, timeout: float = 30.0) -> str:
    """The endpoint's URL once the running controller serves ``service`` ("" when no
    controller runs).

    Raises:
        ConfigError: the controller did not take the service up within ``timeout``,
            or its endpoint did not prove to be this state directory's controller
            (then the token was not sent; see :mod:`deepboot.runtime.client.endpoint`).
    """
    import urllib.error

    from deepboot.runtime.client.endpoint import EndpointError, connect
    from deepboot.runtime.cluster.processes import controller_alive

    if controller_alive(state) is None or not state.http_file.exists():
        return ""
    try:
        endpoint = connect(state)
    except EndpointError as exc:
        raise ConfigError(f"registered {service!r} in the store, but {exc}") from None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            services = endpoint.get_json("/v1/services")
            if any(isinstance(s, dict) and s.get("service") == service for s in services):
                return endpoint.url
        except (urllib.error.URLError, OSError, ValueError, TypeError):
            pass
        time.sleep(0.2)
    raise ConfigError(
        f"registered {service!r}, but the controller at {endpoint.url} did not take it up "
        f"within {timeout:g} s; see {state.logs / 'controller.log'}"
    )


def cmd_cancel(args: argparse.Namespace, out: Console, err: Console) -> int:
    row = _store(args).request_cancel(args.job)
    if row.state.ended:
        out.print(f"{args.job} has already ended ({row.state.value})")
    else:
        out.print(f"cancelling {args.job}")
    return 0


def _attained(counts: dict[str, Any]) -> str:
    """``98.5% (197/200)``, or ``-`` before any request."""
    from deepboot.cli.statusview import attained

    return attained(counts)


def cmd_status(args: argparse.Namespace, out: Console, err: Console) -> int:
    watching = getattr(args, "watch", False)
    every = getattr(args, "every", None)
    if every is not None:
        _positive("every", every, integer=False)
        if not watching:
            raise ConfigError("--every is the refresh period of --watch; add --watch")
    if watching and args.json:
        raise ConfigError("--watch and --json do not go together (--json prints once)")
    state = StateDir.at(args.state_dir)
    # Read once first: no state at all (a mistyped --state-dir) is an error here too.
    doc = status_document(state)
    if watching:
        from deepboot.cli.statusview import DEFAULT_EVERY_S, watch

        return watch(
            lambda: status_document(state),
            out,
            DEFAULT_EVERY_S if every is None else every,
            source=str(state.root),
        )
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    c = doc["cluster"]
    ctl = (
        f"controller pid {c['controller_pid']}" if c["controller_pid"] else "controller NOT running"
    )
    age = (
        f", heartbeat {c['heartbeat_age_s']:.1f} s ago" if c["heartbeat_age_s"] is not None else ""
    )
    out.print(f"cluster: {c['mode'] or 'down'} {c['address'] or ''} - {ctl}{age}")
    if doc["configuration"]:
        out.print(f"configuration: {doc['configuration']['described']}", highlight=False)
    if c["endpoint"]:
        out.print(f"endpoint: {c['endpoint']}")
    gt = Table(title="GPUs")
    for col in ("pool", "node", "GPU", "state", "held by"):
        gt.add_column(col)
    for g in doc["gpus"]:
        holder = g["holder"] or (f"replica of {g['service']}" if g["service"] else "")
        gt.add_row(g["pool"], str(g["node"]), g["gpu"], g["state"], holder)
    _print_whole(out, gt)
    if doc["services"]:
        _print_services(out, doc["services"])
    if doc["caches"]:
        ct = Table(title="model caches (host memory)")
        for col in ("node", "models (least recently used first)", "used / bound"):
            ct.add_column(col)
        for c in doc["caches"]:
            used = f"{c['used_bytes'] / 1e9:.3f} / {c['bound_bytes'] / 1e9:.3f} GB"
            ct.add_row(str(c["node"]), ", ".join(c["models"]) or "none", used)
        out.print(ct)
    _print_jobs(out, doc["jobs"])
    return 0


def _print_services(out: Console, services: list[dict[str, Any]]) -> None:
    """The services table: every column when that fits the terminal, else the compact
    one of ``status --watch`` (names never cut)."""
    from deepboot.cli.statusview import demand_line, services_table

    st = Table(title="services")
    for col in (
        "service",
        "model",
        "replicas (GPU: state)",
        "in flight / replica",
        "cold start",
        "back-off",
        "SLO wait (target)",
        "within SLO, last 5 min",
        "since start",
    ):
        st.add_column(col)
    now = time.time()
    for sv in services:
        reps = ", ".join(f"{r['gpu']}: {r['state']}" for r in sv["replicas"]) or "none"
        cold = f"{sv['cold_start_s']:.2f} s" if sv["cold_start_s"] is not None else ""
        cap = f" (max {sv['max_replicas']})" if sv["max_replicas"] else ""
        slo = sv["slo"]
        st.add_row(
            sv["name"], sv["model"], reps + cap, str(sv["concurrency"]), cold, _backoff(sv, now),
            f"{slo['slo_wait_s']:g} s ({100.0 * slo['slo_target']:g}%)",
            _attained(slo["recent"]), _attained(slo["total"]),
        )  # fmt: skip
    if not _print_fitting(out, st, services_table(services, out.width, cut_names=False)):
        for sv in services:  # the compact table has no back-off column
            if sv["load_failures"]:
                out.print(f"{sv['name']}: back-off: {_backoff(sv, now)}")
    for sv in services:
        line = demand_line(sv)
        if line:
            out.print(f"demand (the SLO guard's reading): {line}", highlight=False, soft_wrap=True)


def _backoff(sv: dict[str, Any], now: float) -> str:
    """A service's crash-loop back-off in words ("" when it has none)."""
    if not sv["load_failures"]:
        return ""
    left = (sv["backoff_until"] or now) - now
    wait = f"{left:.0f} s left" if left > 0 else "over"
    return f"{sv['load_failures']} failed loads; {wait}"


def _print_jobs(out: Console, jobs: list[dict[str, Any]]) -> None:
    """The jobs table, one line per job: every column when that fits the terminal,
    else the compact one of ``status --watch`` (names are never cut: they are what a
    user greps for; names too long for the terminal widen it past it, not fold)."""
    from deepboot.cli.statusview import jobs_table

    jt = Table(title="jobs")
    for col in (
        "job",
        "state",
        "workers",
        "lent GPUs",
        "batch (local x accum)",
        "step",
        "loss",
        "resizes",
        "steps lost",
    ):
        jt.add_column(col, no_wrap=True)
    for j in jobs:
        batch = (
            f"{j['batch_size']} ({j['local_batch_size']} x {j['accumulation_steps']})"
            if j["batch_size"]
            else ""
        )
        loss = f"{j['loss']:.4g}" if j["loss"] is not None else ""
        workers = f"{j['num_workers']} [{', '.join(j['workers'])}]" if j["workers"] else "0"
        jt.add_row(
            j["name"],
            j["state"],
            workers,
            ", ".join(j["lent_gpus"]),
            batch,
            str(j["step"]),
            loss,
            str(j["restarts"]),
            str(j["steps_lost"]),
        )

    _print_fitting(out, jt, jobs_table(jobs, out.width, cut_names=False))
    for j in jobs:
        # Why a job failed, or is restarting (a command job's failed ranks: their
        # exit status and the last lines of their stderr), in full: it is what a user
        # came to status for.
        if j["message"] and j["state"] in ("failed", "running", "queued"):
            out.print(f"{j['name']} ({j['state']}): {j['message']}", highlight=False, markup=False)


def _print_fitting(out: Console, full: Table, compact: Table) -> bool:
    """``full`` when it fits the terminal (True), else ``compact`` (captioned so;
    False), which is printed whole even if its uncut names make it wider than the
    terminal."""
    if _natural(out, full) <= out.width:
        out.print(full)
        return True
    compact.caption = "(a narrow terminal: --json has every column)"
    compact.caption_justify = "left"
    _print_whole(out, compact)
    return False


def _natural(out: Console, table: Table) -> int:
    """The width ``table`` takes with no limit."""
    from rich.measure import Measurement

    return Measurement.get(out, out.options.update_width(1 << 20), table).maximum


def _print_whole(out: Console, table: Table) -> None:
    """``table`` with no cell cut or folded: past the terminal's width if its names
    need it (they are what a user greps for)."""
    for column in table.columns:
        column.no_wrap = True
    width = out.width
    try:
        out.width = max(width, _natural(out, table))
        out.print(table)
    finally:
        out.width = width


def cmd_logs(args: argparse.Namespace, out: Console, err: Console) -> int:
    state = StateDir.at(args.state_dir)
    store = _store(args)
    if args.job in {r.spec.name for r in store.services()} and not _is_job(store, args.job):
        return _service_logs(state, store, args.job, args.tail)
    store.job(args.job)  # raises for an unknown job
    path = state.job_log(args.job)
    lines = path.read_text().splitlines() if path.exists() else []
    if args.tail:
        lines = lines[-args.tail :]
    for line in lines:
        print(line)
    print(f"-- events of {args.job} --")
    for ev in store.events(args.job):
        stamp = time.strftime("%H:%M:%S", time.localtime(ev.time))
        print(f"{stamp} {ev.kind.value} {json.dumps(ev.detail, sort_keys=True)}")
    return 0


def _is_job(store: JobStore, name: str) -> bool:
    return any(r.name == name for r in store.jobs())


def _service_logs(state: StateDir, store: JobStore, name: str, tail: int) -> int:
    """``deepboot logs SERVICE``: its replicas' output (a command service's server's
    lines, prefixed ``[service gpus]``) and its replicas' entries in the event log."""
    path = state.logs / f"service-{name}.log"
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    if tail:
        lines = lines[-tail:]
    for line in lines:
        print(line)
    print(f"-- events of service {name} --")
    for ev in store.events():
        if ev.detail.get("service") == name:
            stamp = time.strftime("%H:%M:%S", time.localtime(ev.time))
            print(f"{stamp} {ev.kind.value} {json.dumps(ev.detail, sort_keys=True)}")
    return 0


def cmd_replay(args: argparse.Namespace, out: Console, err: Console) -> int:
    from rich.progress import Progress, SpinnerColumn, TextColumn

    from deepboot.cli.policy_params import split_pairs
    from deepboot.runtime.client.replay import describe, replay_state

    state = StateDir.at(args.state or args.state_dir)
    params = split_pairs(args.param)
    spinner = SpinnerColumn(), TextColumn("{task.description}")
    with Progress(*spinner, console=err, transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task("replaying: 0 steps", total=None)
        done = [0]

        def step() -> None:
            done[0] += 1
            if done[0] % 200 == 0:
                bar.update(task, description=f"replaying: {done[0]} steps")

        try:
            result = replay_state(state, args.policy, params, step)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    runs = f"{result.starts} controller start{'s' * (result.starts != 1)}"
    if result.divergence is None:
        out.print(f"replayed {result.steps} steps ({runs}): no divergence")
        return 0
    for line in describe(result):
        out.print(line, markup=False, highlight=False, soft_wrap=True)
    out.print(f"({result.steps} steps replayed, {runs})")
    return 1
