"""``--param key=value`` parsing and policy-parameter introspection for the CLI.

Values stay strings: :func:`deepboot.policies.registry.create` converts and validates
them against the policy's config dataclass.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import typing
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from deepboot.cli import limits
from deepboot.core.errors import ConfigError

if TYPE_CHECKING:
    from deepboot.world.settings import SharedCluster


def split_pairs(pairs: Sequence[str]) -> dict[str, str]:
    """``["a=1", "b=x"]`` -> ``{"a": "1", "b": "x"}``.

    Raises:
        ConfigError: an item has no ``=`` or an empty key, or a key repeats.
    """
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--param {pair!r} is not key=value")
        if key in out:
            raise ConfigError(f"--param {key} is given twice")
        out[key] = value.strip()
    return out


def parameter_fields(config_cls: object) -> dict[str, tuple[Any, Any]]:
    """``{name: (type, default)}`` of a dataclass config; ``{}`` if it is not one.

    A field without a default has :data:`dataclasses.MISSING` as its default.
    """
    if not (isinstance(config_cls, type) and dataclasses.is_dataclass(config_cls)):
        return {}
    try:
        hints = typing.get_type_hints(config_cls)
    except (NameError, TypeError):
        hints = {}
    out: dict[str, tuple[Any, Any]] = {}
    for f in dataclasses.fields(config_cls):
        if not f.init:
            continue
        default: Any = f.default
        factory = f.default_factory
        if default is dataclasses.MISSING and callable(factory):
            default = factory()
        out[f.name] = (hints.get(f.name, f.type), default)
    return out


def type_name(tp: Any) -> str:
    """Short readable name of a type annotation (``int``, ``float | None``...)."""
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def describe(tp: Any, default: Any) -> str:
    """``"int = 16"``; enums list their values: ``"Packing (best_fit|most_free) = best_fit"``."""
    text = type_name(tp)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        text += " (" + "|".join(str(m.value) for m in tp) + ")"
    if default is dataclasses.MISSING:
        return text
    shown = default.value if isinstance(default, enum.Enum) else default
    return f"{text} = {shown}"


def add_shared_cluster_flags(parser: argparse.ArgumentParser) -> None:
    """Add the shared-cluster flags of ``deepboot simulate``: lending, lifecycle, AFE
    and the inference-placement policy. Defaults are resolved by
    :func:`shared_cluster_settings`."""
    from deepboot.policies import inference
    from deepboot.policies.lending import LendReserveConfig

    parser.add_argument(
        "--lending",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="lend idle inference-pool GPUs to training (--no-lending: the "
        "training-pool-only baseline; inference runs only on the inference pool)",
    )
    parser.add_argument(
        "--event-lending",
        action="store_true",
        help="decide on every event (ours): a GPU freed between rounds (a job "
        "finished, a replica went to sleep, a reclaim left a spare) goes to the jobs "
        "at once (queued ones start, running ones grow where the gain over a round "
        "pays the resize), within what the round would lend; the next round may undo "
        "it. Off: freed GPUs wait for the next round, as Pollux and DeepBoot",
    )
    parser.add_argument(
        "--lifecycle",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep idle replicas warm (PROTECT) before they become lendable (SLEEP)",
    )
    parser.add_argument(
        "--protect-factor",
        type=float,
        default=1.0,
        metavar="P",
        help="multiply the protect times (30 s + 15 s per hit, at most 120 s) by P, "
        + limits.PROTECT_FACTOR_HELP,
    )
    parser.add_argument(
        "--afe",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="DeepBoot's restart costs with AFE (cheap resizes); --no-afe: every change "
        "costs the model's cold restart. Default: AFE when --inference-nodes > 0, else "
        "the Pollux fidelity runs' flat 30 s",
    )
    parser.add_argument(
        "--reserve",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="predictive lending (ours, beyond the paper): at each tick keep back from "
        "training the idle replicas that each service's recent load says the next "
        "arrivals will need, so they reuse them instead of reclaiming a lent GPU: "
        "fewer reclaims, restarts and cold starts, less lending. Off: DeepBoot lends "
        "every idle GPU",
    )
    parser.add_argument(
        "--reserve-target",
        type=float,
        default=LendReserveConfig().target,
        metavar="Q",
        help="with --reserve, 0 <= Q < 1: hold a service's replicas back "
        "when it sees an arrival before the next tick with probability above 1 - Q, and "
        "then enough of them that an arrival finds one idle with probability Q (rates "
        "and run times of the last --reserve-window seconds). Higher Q: fewer "
        "reclaims, less lending",
    )
    parser.add_argument(
        "--reserve-window",
        type=float,
        default=None,
        metavar="SECONDS",
        help="with --reserve: the seconds of history its rates and run times are "
        "measured over (default 600; shorter: quicker to follow a change of load)",
    )
    slo = parser.add_argument_group(
        "inference SLOs (docs/slo.md; every run reports each request against its "
        "service's slo_wait_s)"
    )
    slo.add_argument(
        "--slo",
        action="store_true",
        help="SLO-guarded lending (ours): per service, forecast the demand from its "
        "arrivals, hold the replicas Erlang B says slo_target of requests need (never "
        "fewer than guaranteed_replicas), pre-warm them ahead of demand, reclaiming "
        "lent GPUs before the requests come, and lend the rest. Replaces --reserve",
    )
    slo.add_argument(
        "--slo-target",
        type=float,
        default=None,
        metavar="Q",
        help="0 < Q < 1: the fraction of requests to serve within slo_wait_s, for "
        "every service (with --slo, --warm-pool or --oracle; default: each service's "
        "slo_target, 0.99 unless its services file says)",
    )
    slo.add_argument(
        "--slo-horizon",
        type=float,
        default=None,
        metavar="SECONDS",
        help="with --slo: look at least this far ahead (it is never less than the "
        "service's cold start + a 30 s resize + one --interval)",
    )
    slo.add_argument(
        "--slo-idle",
        type=float,
        default=None,
        metavar="Q",
        help="with --slo, for services whose slo_wait_s covers their cold start (the "
        "relaxed regime): keep enough idle GPUs that Q of their cold starts find one "
        "instead of waiting on a reclaim, taking them back from training at the ticks "
        "(0 < Q < 1, default 0.75; higher: fewer mid-interval reclaims, less lent)",
    )
    slo.add_argument(
        "--slo-poisson",
        action="store_true",
        help="with --slo: size each service as if its arrivals were Poisson (Erlang B "
        "alone, the sizing before issue 45; for comparison) instead of for the "
        "burstiness measured in its one-second counts (Hayward)",
    )
    slo.add_argument(
        "--warm-pool",
        action="store_true",
        help="reference (not clairvoyant): hold each service's Erlang-B replicas at "
        "its true mean load over the whole workload, warm and never lent, and lend the "
        "rest as deepboot does: a well-tuned static lendingLimit",
    )
    slo.add_argument(
        "--oracle",
        action="store_true",
        help="reference (clairvoyant): as --slo, but holding each service's exact "
        "future demand over the horizon instead of a forecast; a reference, not a "
        "bound (docs/slo.md)",
    )
    host = parser.add_argument_group(
        "warm from host memory (ours, beyond the paper; docs/benchmarks.md)"
    )
    host.add_argument(
        "--host-cache-gb",
        type=float,
        default=None,  # unset until resolve_policy: a preset may fill it
        metavar="GB",
        help="keep the model of every replica evicted from a GPU (lent to training, or "
        "taken by another service) in its node's host memory, up to GB per inference "
        "node (least recently used out first): the next replica of that model there "
        "starts in model_gb / --host-gbps + --host-init-s seconds instead of its cold "
        "start. 0 (default; 1 with --policy guarded): off, every start cold, as DeepBoot",
    )
    host.add_argument(
        "--host-gbps",
        type=float,
        default=None,
        metavar="GB/S",
        help="with --host-cache-gb: host-to-GPU copy bandwidth (default 12: about half "
        "of PCIe 4.0 x16's pinned-memory rate, for a plain pageable copy)",
    )
    host.add_argument(
        "--host-init-s",
        type=float,
        default=None,
        metavar="SECONDS",
        help="with --host-cache-gb: fixed seconds of a start from host memory, before "
        "the copy (default 0.5; an assumption, set a measured one)",
    )
    host.add_argument(
        "--host-cache-preload",
        action="store_true",
        help="with --host-cache-gb: stage the services' models in every inference "
        "node's cache before the first request (spread over the nodes when they do "
        "not all fit), as a platform copies a deployed model to its nodes; without "
        "it a cache holds only what evicted replicas left, so the first starts of "
        "each model are cold",
    )
    parser.add_argument(
        "--ats-i",
        dest="ats_i",
        choices=inference.names(),
        default=None,
        help="inference placement: ATS-I; ats-i-pack, ATS-I whose cold starts fill the "
        "most fragmented node first (ours); random choice; or Lyra-style whole-node "
        "reclaim (default: lyra with --policy lyra, else ats-i)",
    )
    parser.add_argument(
        "--ats-i-param",
        dest="ats_i_param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="parameter of the inference-placement policy; repeat for several (see "
        "'deepboot policies'), e.g. --ats-i-param use_training_pool=false",
    )


def shared_cluster_settings(
    args: argparse.Namespace, inference_nodes: int, policy: str
) -> dict[str, Any]:
    """``SimConfig`` keyword arguments for the flags of :func:`add_shared_cluster_flags`
    (:meth:`SharedCluster.sim_kwargs` of :func:`shared_cluster`).

    Args:
        args: Parsed arguments.
        inference_nodes: Nodes in the inference pool.
        policy: The training policy's name (``lyra`` implies ``--ats-i lyra``).

    Raises:
        ConfigError: as :func:`shared_cluster`.
    """
    return shared_cluster(args).sim_kwargs(inference_nodes=inference_nodes, policy=policy)


def shared_cluster(args: argparse.Namespace) -> SharedCluster:
    """The :class:`~deepboot.world.settings.SharedCluster` the flags of
    :func:`add_shared_cluster_flags` name (``deepboot simulate`` and ``deepboot up``).

    Raises:
        ConfigError: a value is out of range, or two flags contradict each other.
    """
    from deepboot.world.settings import SharedCluster

    factor = limits.check_protect_factor(float(args.protect_factor))
    target = getattr(args, "reserve_target", None)
    if target is not None:
        limits.check_reserve_target(float(target))
    window = getattr(args, "reserve_window", None)
    return SharedCluster(
        lending=bool(args.lending),
        lifecycle=bool(args.lifecycle),
        protect_factor=factor,
        afe=args.afe,
        ats_i=args.ats_i,
        ats_i_params=split_pairs(getattr(args, "ats_i_param", None) or []),
        reserve=bool(getattr(args, "reserve", False)),
        reserve_target=None if target is None else float(target),
        reserve_window=None if window is None else float(window),
        slo=bool(getattr(args, "slo", False)),
        slo_target=getattr(args, "slo_target", None),
        slo_horizon=getattr(args, "slo_horizon", None),
        slo_idle=getattr(args, "slo_idle", None),
        slo_poisson=bool(getattr(args, "slo_poisson", False)),
        warm_pool=bool(getattr(args, "warm_pool", False)),
        oracle=bool(getattr(args, "oracle", False)),
        host_cache_gb=float(getattr(args, "host_cache_gb", 0.0) or 0.0),
        host_gbps=getattr(args, "host_gbps", None),
        host_init_s=getattr(args, "host_init_s", None),
        host_cache_preload=bool(getattr(args, "host_cache_preload", False)),
        event_lending=bool(getattr(args, "event_lending", False)),
    )


def add_interval_and_seed(
    parser: argparse.ArgumentParser, whose: str, *, preset_sets_it: bool = False
) -> None:
    """Add ``--interval`` and ``--seed`` (shared by simulate and compare); ``whose``
    names the randomness the seed drives ("the policy's", "the policies'").

    With ``preset_sets_it`` the interval is left unset (None) until
    :func:`resolve_policy` has let a preset fill it."""
    default = f"{limits.DEFAULT_INTERVAL_S:g}"
    parser.add_argument(
        "--interval",
        type=float,
        default=None if preset_sets_it else limits.DEFAULT_INTERVAL_S,
        metavar="SECONDS",
        help=f"scheduling interval, {limits.INTERVAL_HELP} (default {default}"
        + ("; a preset's own, e.g. 30 for guarded)" if preset_sets_it else ")"),
    )
    parser.add_argument(
        "--seed", type=int, default=0, help=f"seed of {whose} randomness, {limits.SEED_HELP}"
    )


POLICY_HELP = (
    "a training policy or a preset (both listed by 'deepboot policies'). A preset is a "
    "policy with the parameters and flags it runs best with: guarded = deepboot "
    "(objective=power-mean, restart_delay=30, hysteresis=0.05, solver=core) --slo "
    "--host-cache-gb 1 --interval 30, the best configuration measured (simulator: 0.99x "
    "the all-GPU JCT on small.csv, 1.07x on middle.csv, 99.8%% of requests within a 1 s "
    "wait; the paper's deepboot keeps 45%% on small.csv); flags and --param given beside "
    "it win over its own"
)
"""``--policy``'s help where a preset is allowed (simulate, up); argparse %-escapes."""


def resolve_policy(args: argparse.Namespace, default: str | None = None) -> str:
    """Turn ``args.policy`` (or ``default`` when it is None) into a training policy.

    A preset's name (:mod:`deepboot.world.presets`) becomes its training policy, its
    policy parameters go before the user's ``--param`` (of a key the user does not
    give), and the flags it sets that the user left out take its values; then the flags still
    unset take the commands' own defaults (``--interval`` 60 s, ``--host-cache-gb``
    0). Sets ``args.policy`` to the training policy and ``args.preset`` to the
    preset's name ("" for a plain policy).

    Returns:
        The name to show for the run: the preset's, or the policy's.
    """
    from deepboot.world.presets import apply_preset, preset, preset_params

    name = args.policy if args.policy is not None else default
    if name is None:
        raise ConfigError("--policy is required")
    policy, filled = apply_preset(name, vars(args))
    for dest, value in filled.items():
        setattr(args, dest, value)
    given = getattr(args, "param", None)
    if given is not None:
        own = split_pairs(given)
        args.param = [f"{k}={v}" for k, v in preset_params(name, own).items()] + list(given)
    found = preset(name)
    args.policy = policy
    args.preset = found.name if found else ""
    if getattr(args, "interval", 0.0) is None:
        args.interval = limits.DEFAULT_INTERVAL_S
    if getattr(args, "host_cache_gb", 0.0) is None:
        args.host_cache_gb = 0.0
    return policy if found is None else found.name
