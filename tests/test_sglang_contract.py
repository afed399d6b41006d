"""The contract with SGLang 0.5.23, checked against its own code (no GPU needed).

Every launch profile's argv goes through `sglang.srt.server_args.prepare_server_args`, SGLang's
own parser, in a child process (as lingcode.engine.sglang.probe runs it for `lingcode doctor`), and every
switch must have taken. The adapter's request body goes through SGLang's /generate schema, and
the replayed wire format through SGLang's own JSON encoder.

`make test` installs sglang with --no-deps plus the few packages its parser imports
(tests/sglang-parser-requirements.txt); its declared dependencies are a CUDA stack.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import sglang_wire as wire
from lingcode.engine import SamplingParams
from lingcode.engine.sglang import probe
from lingcode.engine.sglang.adapter import generate_body, sampling_params
from lingcode.engine.sglang.profiles import SGLANG_VERSION, builtin_profiles, resolve, verify_window

if importlib.util.find_spec("sglang") is None:
    pytest.fail(
        "sglang is not installed: `make test` installs it (pip install --no-deps "
        f"sglang=={SGLANG_VERSION} -r tests/sglang-parser-requirements.txt)",
        pytrace=False,
    )

# Runs before SGLang is imported: parsing must not reach the network, start processes (nvidia-smi)
# or initialise CUDA. Asking torch whether CUDA exists is allowed, and recorded.
GUARD = """
import atexit, json, socket, subprocess, torch, torch.cuda
_probes = []
def _refuse(what):
    def refuse(*args, **kwargs):
        raise RuntimeError("prepare_server_args tried to " + what)
    return refuse
socket.socket.connect = socket.socket.connect_ex = _refuse("open a network connection")
socket.getaddrinfo = _refuse("resolve a host name")
subprocess.Popen.__init__ = _refuse("start a process")
torch.cuda._lazy_init = _refuse("initialise CUDA")
_is_available = torch.cuda.is_available
def _probe():
    _probes.append("torch.cuda.is_available")
    return _is_available()
torch.cuda.is_available = _probe
atexit.register(lambda: open(REPORT, "w").write(json.dumps({"probes": _probes, "cuda_initialized": torch.cuda.is_initialized()})))
"""

PROFILES = builtin_profiles()
OVERRIDES = {"args": {"mem-fraction-static": 0.85, "disable-radix-cache": False, "context-length": 65536,
                      "json-model-override-args": {"router_dtype": "bf16"}},
             "env": {"SGLANG_OPT_FUSE_SWIGLU_INTERLEAVED": False}}  # fmt: skip
REFUSED = {
    "renamed": ["--model-path", "m", "--cuda-graph-max-bs", "1"],  # split into -decode / -prefill
    "bad choice": ["--model-path", "m", "--tool-call-parser", "ling9"],
    "gone": ["--model-path", "m", "--enable-spec-v2"],
    "prefix": ["--model-path", "m", "--speculative-dspark-block", "8"],  # argparse takes a prefix
}


@pytest.fixture(scope="module")
def parsed(tmp_path_factory):
    """Everything these tests parse, in one child process (it imports torch and SGLang: seconds).
    {"profiles": {name: (Profile, parse)}, "overridden": (Profile, parse), "refused": {case: parse},
    "guard": what the child did besides parsing}."""
    report = tmp_path_factory.mktemp("guard") / "report.json"
    profiles = {name: resolve(name, config={}) for name in PROFILES}
    overridden = resolve("ling-3.0-flash-dspark-agent", config=OVERRIDES)
    launches = [{"argv": p.argv, "env": p.env} for p in [*profiles.values(), overridden]]
    launches += [{"argv": argv} for argv in REFUSED.values()]
    results = probe.parse_launch_args(sys.executable, launches, prelude=f"REPORT = {str(report)!r}\n" + GUARD)
    return {
        "profiles": {name: (profiles[name], result) for name, result in zip(profiles, results)},
        "overridden": (overridden, results[len(profiles)]),
        "refused": dict(zip(REFUSED, results[len(profiles) + 1 :])),
        "guard": json.loads(report.read_text()),
    }


def test_the_installed_sglang_is_the_one_the_profiles_are_written_for():
    assert importlib.metadata.version("sglang") == SGLANG_VERSION
    assert set(PROFILES) >= {
        "ling-3.0-flash-dspark",
        "ling-3.0-flash-nextn",
        "ling-3.0-flash-dspark-hopper",
        "ling-3.0-flash-dspark-agent",
    }


def test_parsing_touches_no_gpu_and_no_network(parsed):
    report = parsed["guard"]
    assert report["cuda_initialized"] is False
    assert set(report["probes"]) <= {"torch.cuda.is_available"}  # platform detection asks; nothing more


@pytest.mark.parametrize("name", PROFILES)
def test_every_switch_took(parsed, name):
    profile, result = parsed["profiles"][name]
    assert "error" not in result, result.get("error")
    a = result["args"]
    assert result["launch_command"] == " ".join(profile.argv)  # SGLang parsed exactly our argv
    assert result["inexact_flags"] == []  # every flag spelled as SGLang spells it, not a prefix of one
    assert a["model_path"] == "inclusionAI/Ling-3.0-flash" and a["trust_remote_code"] is True
    assert a["tp_size"] == 4 and a["dtype"] == "bfloat16"
    assert a["max_running_requests"] == 1  # SGLang resets an unset value to 48 under speculation
    if "nextn" in name:
        assert a["speculative_algorithm"] == "NEXTN" and a["speculative_draft_model_path"] == a["model_path"]
        assert (a["speculative_num_steps"], a["speculative_eagle_topk"], a["speculative_num_draft_tokens"]) == (5, 1, 6)
    else:
        assert a["speculative_algorithm"] == "DSPARK"
        assert a["speculative_draft_model_path"] == "inclusionAI/Ling-3.0-flash-dspark"
        assert a["speculative_dspark_block_size"] == 8
    window = verify_window(profile.args)
    assert window == (6 if "nextn" in name else 9)
    assert a["enable_linear_replayssm_spec"] is True and a["enable_linear_replayssm"] is False
    assert a["linear_replayssm_cache_len"] >= window
    assert a["tool_call_parser"] == "ling3" and a["reasoning_parser"] == "ling3"
    assert a["cuda_graph_max_bs_decode"] == 1
    assert a["disable_overlap_schedule"] is False
    assert a["flashinfer_allreduce_fusion_backend"] == "auto"
    if profile.arch == "hopper":
        assert a["attention_backend"] is None and a["page_size"] is None  # never trtllm_mla on Hopper
    else:
        assert a["attention_backend"] == "trtllm_mla" and a["page_size"] == 64
    if name.endswith("-agent"):
        assert a["disable_radix_cache"] is False and a["mamba_radix_cache_strategy"] == "extra_buffer"
        assert a["mamba_track_interval"] >= window and a["mamba_track_interval"] % a["page_size"] == 0
    else:
        assert a["disable_radix_cache"] is True
    env = result["env"]
    assert env["SGLANG_OPT_FUSED_KDA_VERIFY"] == {"known": True, "value": True}
    assert env["SGLANG_RAGGED_VERIFY_MODE"] == {"known": True, "value": "static"}
    assert env["SGLANG_OPT_FUSE_SWIGLU_INTERLEAVED"] == {"known": True, "value": True}


def test_the_parser_refuses_what_0_5_23_does_not_know(parsed):
    """A guard on the guard: names that moved or never existed are refused, prefixes reported."""
    refused = parsed["refused"]
    assert "ambiguous option: --cuda-graph-max-bs" in refused["renamed"]["error"][0]
    assert "invalid choice: 'ling9'" in refused["bad choice"]["error"][0]
    assert "unrecognized arguments: --enable-spec-v2" in refused["gone"]["error"][0]
    assert refused["prefix"]["args"]["speculative_dspark_block_size"] == 8
    assert refused["prefix"]["inexact_flags"] == ["--speculative-dspark-block"]


def test_config_overrides_reach_the_parser(parsed):
    profile, result = parsed["overridden"]
    a = result["args"]
    assert a["mem_fraction_static"] == 0.85 and a["context_length"] == 65536
    assert json.loads(a["json_model_override_args"]) == {"router_dtype": "bf16"}
    assert "SGLANG_OPT_FUSE_SWIGLU_INTERLEAVED" not in result["env"] and result["inexact_flags"] == []


# Checked by SGLang's own code, in a child process (importing sglang would change this process's
# environment: it redirects third-party cache directories).
SCHEMA = r"""
import json, sys
from sglang.api.v1.api_types import GenerateRequest, SamplingParams
from sglang.srt.utils.json_response import dumps_json
data = json.load(sys.stdin)
for body in data["bodies"]:
    GenerateRequest.from_json_value(body)
    SamplingParams.from_json_value(body["sampling_params"])
for event in data["events"]:
    payload = event[len("data: "):-2].encode()
    assert dumps_json(json.loads(payload)) == payload, event
print("ok")
"""


def test_requests_fit_sglang_schema_and_the_replayed_bytes_are_sglangs():
    bodies = [
        {
            "rid": "r-1",
            "input_ids": [1, 2, 3],
            "stream": True,
            "sampling_params": sampling_params(params, (156895,), 1000),
        }
        for params in (
            SamplingParams(max_tokens=16, temperature=0.0),
            SamplingParams(max_tokens=16, temperature=0.6, top_p=0.95, top_k=20, seed=3, stop_token_ids=(7,)),
            SamplingParams(max_tokens=16, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05),
            SamplingParams(max_tokens=16, ignore_eos=True),
        )
    ]
    events = [e.decode() for e in wire.DSPARK_STREAM + wire.ERROR_STREAM if e != wire.DONE]
    done = subprocess.run(
        [sys.executable, "-c", SCHEMA],
        input=json.dumps({"bodies": bodies, "events": events}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.strip() == "ok", done.stderr[-2000:]


# SGLang's /generate handler builds a GenerateReqInput from the body (unknown keys are a TypeError),
# normalizes it, and the scheduler builds and verifies its SamplingParams. Importing io_struct pulls
# SGLang's model-config registry, whose vision configs import torchvision at module level; torchvision
# cannot be installed beside the CPU torch (tests/sglang-parser-requirements.txt), and the request
# path never touches it, so it is stubbed in the child alone.
REQUEST = r"""
import importlib.abc, importlib.machinery, json, sys, types

class _Anything(type):  # whatever is asked of a stubbed name: itself
    def __getattr__(cls, name): return cls
    def __call__(cls, *args, **kwargs): return cls
    def __getitem__(cls, key): return cls
    def __iter__(cls): return iter(())
    def __or__(cls, other): return cls
    __ror__ = __or__

class Anything(metaclass=_Anything):
    pass

class _TorchvisionStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__getattr__ = lambda attr: Anything
        module.__path__, module.__file__ = [], "<stub>"
        return module
    def exec_module(self, module): pass

sys.meta_path.insert(0, _TorchvisionStub())
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.sampling.sampling_params import SamplingParams
data = json.load(sys.stdin)
for body in data["bodies"]:
    request = GenerateReqInput(**body)
    request.normalize_batch_and_arguments()
    assert request.is_single and request.stream and request.rid == body["rid"], request
    params = SamplingParams(**request.sampling_params)
    params.verify(data["vocab_size"])
    params.normalize(None)
    assert params.max_new_tokens == body["sampling_params"]["max_new_tokens"]
    assert params.repetition_penalty == body["sampling_params"]["repetition_penalty"]
try:
    GenerateReqInput(**{**data["bodies"][0], "not_a_field": 1})
except TypeError:
    print("ok")
"""


def test_generate_bodies_fit_sglangs_own_request_dataclass():
    """What the adapter sends to /generate, through sglang.srt.managers.io_struct.GenerateReqInput and the
    scheduler's SamplingParams checks (a guard: an unknown key must fail there)."""
    params = [
        SamplingParams(max_tokens=16, temperature=0.0),
        SamplingParams(max_tokens=4096, temperature=0.6, top_p=0.95, top_k=20, seed=3, stop_token_ids=(7, 9)),
        SamplingParams(max_tokens=16, ignore_eos=True),
        SamplingParams(max_tokens=16, temperature=0.0, repetition_penalty=1.05),  # greedy and penalized
    ]
    bodies = [generate_body(f"r-{i}-abc", [1, 2, 3], p, (156895,), 1000) for i, p in enumerate(params)]
    done = subprocess.run(
        [sys.executable, "-c", REQUEST],
        input=json.dumps({"bodies": bodies, "vocab_size": 157184}),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.stdout.strip().splitlines()[-1:] == ["ok"], done.stderr[-3000:]


def test_the_wire_format_the_adapter_reads_is_still_in_sglangs_source():
    """A tripwire for SGLang upgrades: the lines the adapter's parser is written against."""
    root = Path(importlib.util.find_spec("sglang").origin).parent / "srt"
    http = (root / "entrypoints" / "http_server.py").read_text()
    manager = (root / "managers" / "tokenizer_manager.py").read_text()
    for line in (
        'yield b"data: " + dumps_json(out) + b"\\n\\n"',
        'yield b"data: [DONE]\\n\\n"',
        '@app.post("/abort_request")',
        '@app.get("/health_generate")',
        '@app.get("/server_info")',
    ):
        assert line in http, line
    for line in (
        '"prompt_tokens": recv_obj.prompt_tokens[i]',
        '"completion_tokens": recv_obj.completion_tokens[i]',
        '"cached_tokens": recv_obj.cached_tokens[i]',
        'meta_info["spec_accept_length"]',
        '"output_ids": state.output_ids.copy()',
        'meta_info["e2e_latency"]',
    ):
        assert line in manager, line
