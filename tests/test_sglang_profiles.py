"""Launch profiles: data files, inheritance, the user's config.toml, and the constraints between switches."""

from __future__ import annotations

import pytest

from lingcode.engine.sglang.profiles import (
    DEFAULT_PROFILE,
    ProfileError,
    builtin_profiles,
    load_config,
    resolve,
    to_argv,
)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LINGCODE_HOME", str(tmp_path))
    return tmp_path


def write_config(home, text: str) -> None:
    (home / "config").mkdir(exist_ok=True)
    (home / "config" / "config.toml").write_text(text)


def test_the_default_profile_is_the_blogs_command_plus_the_cookbooks_switches(home):
    p = resolve()
    assert p.name == DEFAULT_PROFILE == "ling-3.0-flash-dspark" and p.arch == "blackwell" and p.tp_size == 4
    argv = p.argv
    # the blog's DSpark command, flag for flag
    for flag in (
        "--model-path inclusionAI/Ling-3.0-flash",
        "--tp-size 4",
        "--trust-remote-code",
        "--speculative-algorithm DSPARK",
        "--speculative-draft-model-path inclusionAI/Ling-3.0-flash-dspark",
        "--attention-backend trtllm_mla",
        "--flashinfer-allreduce-fusion-backend auto",
        "--disable-radix-cache",
        # the cookbook's, and the rest of the latency switches
        "--enable-linear-replayssm-spec",
        "--linear-replayssm-cache-len 32",
        "--max-running-requests 1",
        "--cuda-graph-max-bs-decode 1",
        "--dtype bfloat16",
    ):
        assert flag in " ".join(argv), flag
    assert p.env == {
        "SGLANG_RAGGED_VERIFY_MODE": "static",
        "SGLANG_OPT_FUSED_KDA_VERIFY": "1",
        "SGLANG_OPT_FUSE_SWIGLU_INTERLEAVED": "1",
    }
    assert p.sources["args.tp-size"] == "profile ling-3.0-flash-dspark"
    assert p.command()[1:3] == ["-m", "sglang.launch_server"]


def test_variants_change_only_what_they_say(home):
    base = resolve("ling-3.0-flash-dspark").args
    hopper = resolve("ling-3.0-flash-dspark-hopper")
    assert "attention-backend" not in hopper.args and "trtllm_mla" not in hopper.argv and hopper.arch == "hopper"
    assert {k: v for k, v in base.items() if k not in ("attention-backend", "page-size")} == hopper.args
    agent = resolve("ling-3.0-flash-dspark-agent").args
    assert "disable-radix-cache" not in agent and agent["mamba-radix-cache-strategy"] == "extra_buffer"
    assert agent["mamba-track-interval"] % agent["page-size"] == 0 and agent["mamba-track-interval"] >= 9
    nextn = resolve("ling-3.0-flash-nextn").args
    assert nextn["speculative-algorithm"] == "NEXTN" and "speculative-dspark-block-size" not in nextn
    assert nextn["speculative-draft-model-path"] == nextn["model-path"]  # "${model-path}"


def test_config_toml_overrides_any_flag_and_env(home):
    write_config(
        home,
        """
[sglang]
profile = "ling-3.0-flash-dspark-agent"
python = "/opt/sglang/bin/python"
args = { model-path = "/models/Ling-3.0-flash", mem-fraction-static = 0.85, cuda-graph-max-bs-decode = false }
env = { SGLANG_OPT_FUSE_SWIGLU_INTERLEAVED = false, NCCL_DEBUG = "WARN" }
""",
    )
    p = resolve()
    assert p.name == "ling-3.0-flash-dspark-agent" and p.python == "/opt/sglang/bin/python"
    assert p.args["model-path"] == "/models/Ling-3.0-flash" and "--mem-fraction-static" in p.argv
    assert "cuda-graph-max-bs-decode" not in p.args
    assert "SGLANG_OPT_FUSE_SWIGLU_INTERLEAVED" not in p.env and p.env["NCCL_DEBUG"] == "WARN"
    assert p.sources["args.mem-fraction-static"].endswith("config.toml")
    # the command line (--model) wins over both; the explicit --profile over config.toml's
    q = resolve("ling-3.0-flash-nextn", overrides={"model-path": "/fast/Ling"})
    assert q.args["model-path"] == q.args["speculative-draft-model-path"] == "/fast/Ling"
    assert q.sources["args.model-path"] == "command line"


def test_a_profile_file_of_ones_own(home, tmp_path):
    mine = tmp_path / "mine.toml"
    mine.write_text('extends = "ling-3.0-flash-dspark"\ndescription = "two GPUs"\n[args]\ntp-size = 2\n')
    p = resolve(str(mine))
    assert p.tp_size == 2 and p.description == "two GPUs" and p.args["speculative-algorithm"] == "DSPARK"


@pytest.mark.parametrize(
    "args, message",
    [
        ({"port": 30000}, "set by lingcode at launch"),
        ({"max-running-requests": False}, "max-running-requests must be set"),
        ({"linear-replayssm-cache-len": 8}, "shorter than the verify window of 9"),
        ({"enable-linear-replayssm": True}, "exclude each other"),
        ({"disable-radix-cache": False, "mamba-radix-cache-strategy": "no_buffer"}, "no_buffer needs overlap"),
        (
            {"disable-radix-cache": False, "mamba-radix-cache-strategy": "extra_buffer", "mamba-track-interval": 8},
            ">= the verify window",
        ),
        (
            {"disable-radix-cache": False, "mamba-radix-cache-strategy": "extra_buffer", "mamba-track-interval": 96},
            "multiple of page-size 64",
        ),
        ({"speculative-draft-model-path": "${nothing}"}, "names no other flag"),
    ],
)
def test_constraints_fail_early_with_the_reason(home, args, message):
    with pytest.raises(ProfileError, match=message):
        resolve(config={"args": args})


def test_config_mistakes_are_named(home):
    write_config(home, "[sglang]\nprofiel = 'x'\n")
    with pytest.raises(ProfileError, match="unknown key.*profiel"):
        load_config()
    write_config(home, "[sglang\n")
    with pytest.raises(ProfileError, match="config.toml"):
        load_config()
    with pytest.raises(ProfileError, match="unknown SGLang profile 'nope'"):
        resolve("nope", config={})


def test_to_argv():
    assert to_argv({"a": True, "b": False, "c": 3, "d": [1, 2], "e": {"k": "v"}, "f": 0.5}) == [
        "--a",
        "--c",
        "3",
        "--d",
        "1",
        "2",
        "--e",
        '{"k":"v"}',
        "--f",
        "0.5",
    ]


def test_builtin_profiles_are_shipped():
    assert set(builtin_profiles()) == {
        "ling-3.0-flash-dspark",
        "ling-3.0-flash-nextn",
        "ling-3.0-flash-dspark-hopper",
        "ling-3.0-flash-dspark-agent",
    }
