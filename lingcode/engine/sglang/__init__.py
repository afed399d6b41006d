"""The production engine: Ling-3.0-flash (+ its DSpark draft) served by SGLang, behind lingcode's Engine interface.

    profiles.py    launch profiles (lingcode/data/profiles/*.toml) + config.toml -> argv and env
    probe.py       asks SGLang's own interpreter for versions and for its parse of an argv
    preflight.py   GPUs, driver, interpreter and model checks: one actionable line each
    supervisor.py  runs `python -m sglang.launch_server` in its own process group; restarts, stops
    adapter.py     the Engine over SGLang's /generate (streamed) and /abort_request
    model_dir.py   tokenizer, chat template and eos ids from the model directory
    engine.py      open_engine(): all of the above, for `lingcode serve --engine sglang`
    doctor.py      the switch and environment tables of `lingcode doctor`

SGLang is never imported here: it lives in its own environment (its own torch and CUDA pins),
and lingcode talks to it over HTTP and through child processes.
"""
