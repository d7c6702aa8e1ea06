"""``deepboot compare``: the --run mini-syntax and the command line it records."""

from __future__ import annotations

import pytest

from deepboot.cli.compare import command_line
from deepboot.cli.main import build_parser
from deepboot.core.errors import ConfigError
from deepboot.matrix import RunSpec, parse_run


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("deepboot=deepboot", RunSpec("deepboot", "deepboot", text="deepboot=deepboot")),
        (
            "pollux-only=pollux:no-lending",
            RunSpec("pollux-only", "pollux", lending=False, text="pollux-only=pollux:no-lending"),
        ),
        (
            "x=deepboot:no-afe,no-lifecycle,ats-i=random,protect-factor=2",
            RunSpec(
                "x",
                "deepboot",
                afe=False,
                lifecycle=False,
                inference_policy="random",
                protect_factor=2.0,
                text="x=deepboot:no-afe,no-lifecycle,ats-i=random,protect-factor=2",
            ),
        ),
        (
            "pollux:no-lending",
            RunSpec("pollux-no-lending", "pollux", lending=False, text="pollux:no-lending"),
        ),
        (
            "deepboot:ats-i=lyra",
            RunSpec("deepboot-ats-i-lyra", "deepboot", inference_policy="lyra",
                    text="deepboot:ats-i=lyra"),
        ),
        (
            "t=tiresias:queue_threshold_gpu_hours=8,lending,afe",
            RunSpec("t", "tiresias", lending=True, afe=True,
                    params=(("queue_threshold_gpu_hours", "8"),),
                    text="t=tiresias:queue_threshold_gpu_hours=8,lending,afe"),
        ),
        (
            " limit = pollux : no-inference ",
            RunSpec("limit", "pollux", no_inference=True, text="limit = pollux : no-inference"),
        ),
    ],
    ids=["plain", "no-lending", "ablation", "unnamed", "unnamed-valued", "params", "spaces"],
)  # fmt: skip
def test_parse_run(text: str, expected: RunSpec) -> None:
    assert parse_run(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x=", "no policy"),
        ("x=pollux:", "empty flag"),
        ("x=pollux:no-lending,,afe", "empty flag"),
        ("x=pollux:no-lendig", "unknown flag 'no-lendig'"),
        ("x=pollux:lending,no-lending", "lending is set twice"),
        ("x=pollux:ats-i=", "ats-i needs"),
        ("x=pollux:ats-i=random,ats-i=lyra", "ats-i needs"),
        ("x=pollux:protect-factor=-1", "protect-factor must be a number"),
        ("x=pollux:protect-factor=abc", "protect-factor must be a number"),
        ("x=pollux:k=1,k=2", "repeated parameter"),
        ("x=pollux:reserve,no-reserve", "reserve is set twice"),
        ("x=pollux:reserve-target=-0.5", "reserve-target must be a number"),
        ("a/b=pollux", "letters, digits"),
        ("../x=pollux", "letters, digits"),
    ],
    ids=[
        "no-policy", "trailing-colon", "double-comma", "typo", "both-ways", "empty-ats-i",
        "two-ats-i", "negative-factor", "nan-factor", "repeated-param", "two-reserves",
        "negative-reserve", "slash", "dotdot",
    ],
)  # fmt: skip
def test_parse_run_errors_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        parse_run(text)


def test_reserve_target_alone_turns_the_reserve_on() -> None:
    from deepboot.matrix import sim_config

    on = sim_config(parse_run("x=deepboot:reserve-target=0.9"), 60.0, 0, 8).lend_reserve
    assert (on.enabled, on.target) == (True, 0.9)
    assert sim_config(parse_run("x=deepboot:reserve"), 60.0, 0, 8).lend_reserve.target == 0.7
    assert not sim_config(parse_run("x=deepboot"), 60.0, 0, 8).lend_reserve.enabled


def test_command_line_is_canonical_and_shell_quoted() -> None:
    args = build_parser().parse_args(
        [
            "compare",
            "--workload", "my work.csv",
            "--run", "a=pollux:no-lending",
            "--out", "out dir",
            "--seed", "3",
        ]
    )  # fmt: skip
    text = command_line(args)
    assert text == (
        "deepboot compare --workload 'my work.csv' --cluster 16x4 --inference-nodes 8 "
        "--run a=pollux:no-lending --interval 60 --seed 3 --out 'out dir'"
    )
    # It parses back to the same settings.
    import shlex

    again = build_parser().parse_args(shlex.split(text)[1:])
    assert command_line(again) == text
