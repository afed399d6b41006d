"""Whether an agent tool call may run: the person's rule file, then "always" answers, then defaults.

The rule file is TOML in the config dir (`lingcode chat` writes a commented example on first use):

    [[rule]]
    tool = "run_command"     # a tool name, or "*"
    match = "git status*"    # a glob on the call's subject: the path for file tools, the command line for run_command
    action = "allow"         # allow | ask | deny

The first matching rule decides. Without one: reads inside the working directory are allowed,
everything else asks, and "always for this session" answers turn asks into allows (deny rules still
win). A rule file that cannot be read, or that another user owns or may write, makes everything
ask, and the UI says why.

Paths are matched after symlinks are resolved, relative to the working directory (absolute
outside it); a glob without "/" also matches the file's name in any folder (".env*" denies
sub/.env too). A rule that matches a folder covers everything under it, for every file tool:
"secrets" denies secrets/key.txt, a/secrets/b/c, and a link whose target lies under one of them.
grep decides every file it reaches the same way (file_check). Rules see names: a hard link
elsewhere to a denied file is another name for it, and is not covered.

A command line is read with a shell tokenizer (shlex). An allow rule allows only a plain command:
one that chains (; && || &), pipes, redirects, substitutes ($, `) or spans lines gets asked about,
unless the rule's match is "*" (every command line). Deny and ask rules apply to the whole line and
to each command in it. Deny rules on commands are a convenience, not a sandbox: a command can
always be written another way, which then asks.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import shlex
import stat
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lingcode import paths
from lingcode.tui.tools.files import display

ACTIONS = ("allow", "ask", "deny")
COMMAND_TOOL = "run_command"
SHELL_OPERATORS = "();<>|&`"  # bash's metacharacters besides blanks, and ` (command substitution)
NOT_A_COMMAND = frozenset("{ } ! [[ ]] if then else elif fi do done while until for in case esac time coproc".split())

EXAMPLE = """\
# lingcode chat: which agent tool calls run without asking. The first matching rule decides.
#   tool   = a tool name (read_file, list_dir, grep, apply_edit, write_file, run_command) or "*"
#   match  = a glob on what the call touches: the path (relative to the working directory, after
#            symlinks; a glob without "/" also matches a file name in any folder; a rule that
#            matches a folder covers everything under it) for file tools, the whole command line
#            for run_command (default "*")
#   action = "allow", "ask" or "deny"
# Without a matching rule, reads inside the working directory are allowed and the rest asks.
# An allow rule for run_command never allows a line that chains, pipes, redirects or substitutes
# (git status; rm x): those ask, unless match = "*".
#
# [[rule]]
# tool = "run_command"
# match = "git status*"
# action = "allow"
#
# [[rule]]
# tool = "*"
# match = ".env*"
# action = "deny"
"""


def rules_file() -> Path:
    return paths.config_dir() / "permissions.toml"


@dataclass(frozen=True)
class Rule:
    tool: str
    match: str
    action: str

    def applies(self, tool: str, subject: str) -> bool:
        if not fnmatch.fnmatchcase(tool, self.tool):
            return False
        if tool == COMMAND_TOOL:
            return self._applies_to_command(subject)
        return any(self._applies_to_path(path) for path in _path_and_folders(subject))

    def _applies_to_path(self, path: str) -> bool:
        if fnmatch.fnmatchcase(path, self.match):
            return True
        return "/" not in self.match and fnmatch.fnmatchcase(posixpath.basename(path), self.match)

    def _applies_to_command(self, line: str) -> bool:
        if self.match == "*":
            return True
        if self.action == "allow":  # only a plain command: nothing else may ride along
            return plain_command(line) and fnmatch.fnmatchcase(line, self.match)
        return any(fnmatch.fnmatchcase(part, self.match) for part in (line, *commands_in(line)))


def _path_and_folders(path: str) -> list[str]:
    """The path and each folder it lies in, up to the working directory or "/" (which would match ".*")."""
    paths = [path]
    while (path := posixpath.dirname(path)) not in ("", ".", "/"):
        paths.append(path)
    return paths


def _tokens(line: str) -> list[str] | None:
    """The command line's words and operators, as a shell splits them; None if it cannot be split."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=SHELL_OPERATORS)
    lexer.whitespace_split = True
    lexer.commenters = ""  # shlex would end a line at any "#"; bash only at a word's start
    try:
        return list(lexer)
    except ValueError:  # an unclosed quote
        return None


def _operator(token: str) -> bool:
    return all(c in SHELL_OPERATORS for c in token)  # an escaped or quoted lone ";" too: it errs to asking


def plain_command(line: str) -> bool:
    """One command and its arguments: no operator, redirection, expansion ($, `) or second line."""
    if any(c in line for c in "$`\n\0"):
        return False
    tokens = _tokens(line)
    return tokens is not None and not any(_operator(t) for t in tokens)


def commands_in(line: str) -> list[str]:
    """Each command of the line, its words joined by one space, without leading keywords or VAR=value."""
    tokens = _tokens(line.replace("\n", ";").replace("$(", "("))
    if tokens is None:
        return []
    commands, words = [], []
    for token in [*tokens, ";"]:
        if not _operator(token):
            if words or (token not in NOT_A_COMMAND and not _assignment(token)):
                words.append(token)
            continue
        if words:
            commands.append(" ".join(words))
        words = []
    return commands


def _assignment(word: str) -> bool:
    name, equals, _ = word.partition("=")
    return bool(equals) and name.isidentifier()


@dataclass(frozen=True)
class Decision:
    action: str  # allow | ask | deny
    reason: str


class Permissions:
    def __init__(self, rules: list[Rule], source: str = "", problem: str | None = None):
        self.rules, self.source, self.problem = rules, source, problem

    @classmethod
    def load(cls, path: Path | None = None) -> Permissions:
        path = path or rules_file()
        if not path.exists():
            try:
                paths.private_file(path).write_text(EXAMPLE)
            except OSError:
                pass
            return cls([], str(path))
        try:
            _check_private(path)
            return cls(parse_rules(tomllib.loads(path.read_text())), str(path))
        except (OSError, ValueError) as e:
            return cls([], str(path), problem=f"{path}: {e}; every tool call asks until it is fixed")

    def decide(self, tool: str, subject: str, *, reads: bool, inside: bool, always: list[str] = ()) -> Decision:
        for number, rule in enumerate(self.rules, start=1):
            if rule.applies(tool, subject):
                where = f"rule {number} in {self.source}"
                if rule.action == "ask" and tool in always:
                    return Decision("allow", f"allowed for this session ({where} asks)")
                return Decision(rule.action, where)
        if self.problem:
            return Decision("ask", self.problem)
        if tool in always:
            return Decision("allow", "allowed for this session")
        if reads and inside:
            return Decision("allow", "a read inside the working directory")
        return Decision("ask", "outside the working directory" if reads else "writes and commands ask first")

    def file_check(
        self, tool: str, workdir: Path, root: Path, *, root_approved: bool, always: list[str] = ()
    ) -> Callable[[Path], str]:
        """How a tool that reads many files (grep) treats each one it reaches, given as a resolved path:
        "allow" (read it), "deny", or "ask" (not read; the result names it, read_file then asks).

        Each file is decided as the call itself would be for that path. Deny rules for the tool or
        for read_file win. A file that would ask is read only when the person approved this call,
        for a path outside the working directory, and the file lies under that path: a link out of
        it is not covered by that answer.
        """
        workdir = workdir.resolve()

        def check(target: Path) -> str:
            inside = target.is_relative_to(workdir)
            subject = display(workdir, target)
            decisions = [
                self.decide(name, subject, reads=True, inside=inside, always=always) for name in (tool, "read_file")
            ]
            if any(d.action == "deny" for d in decisions):
                return "deny"
            if decisions[0].action == "ask" and root_approved and target.is_relative_to(root):
                return "allow"
            return decisions[0].action

        return check


def _check_private(path: Path) -> None:
    """Rules that another user wrote, or could have, are no rules of this person's (they could allow anything)."""
    info = path.stat()
    if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
        raise ValueError(f"the file belongs to another user (uid {info.st_uid})")
    if os.name == "posix" and info.st_mode & 0o022:
        raise ValueError(
            f"other users may write the file (mode {stat.S_IMODE(info.st_mode):o}); check it, then `chmod 600` it"
        )


def parse_rules(document: dict) -> list[Rule]:
    rules = document.get("rule", [])
    if not isinstance(rules, list):
        raise ValueError("`rule` must be an array of tables ([[rule]])")
    parsed = []
    for number, rule in enumerate(rules, start=1):
        if not isinstance(rule, dict):
            raise ValueError(f"rule {number} must be a table")
        unknown = set(rule) - {"tool", "match", "action"}
        if unknown:
            raise ValueError(f"rule {number} has unknown keys {sorted(unknown)}")
        action = rule.get("action")
        if action not in ACTIONS:
            raise ValueError(f"rule {number}: action must be one of {', '.join(ACTIONS)}, not {action!r}")
        tool, match = rule.get("tool", "*"), rule.get("match", "*")
        if not isinstance(tool, str) or not isinstance(match, str):
            raise ValueError(f"rule {number}: tool and match must be strings")
        parsed.append(Rule(tool, match, action))
    return parsed
