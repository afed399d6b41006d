"""`lingcode lsp`: the language server that puts the daemon's completions into an editor (pygls, stdio).

    textDocument/inlineCompletion  ghost text (LSP 3.18): the suggestion at the cursor
    textDocument/completion        the same suggestion as one completion item (editors without
                                   inline completion)
    lingcode/stats                 the running figures: requests, typed-ahead hits, engine calls,
                                   prompt and cached tokens, latencies, the last completion
    documents                      incremental sync (pygls keeps the text); opening, saving and
                                   leaving a file feed the extra-context ring

The handlers are async and only await the daemon over HTTP, so a didChange, a $/cancelRequest or
another request is handled while a completion is in flight. The work is in completer.py.

Messages are read by wire.py, not by pygls' own loop: malformed or over-size input (a message is
at most 32 MiB) is logged and skipped, and the server goes on with the next message. A file is
never read on the message loop: an unopened document is read on a thread, and only if it is a
regular file of at most 32 MiB (a FIFO would block the read for ever).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sys
import threading
import uuid
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote

from lsprotocol import types
from pygls.io_ import StdoutWriter
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path
from pygls.workspace import TextDocument

from lingcode import __version__
from lingcode.client import DaemonLink, Progress
from lingcode.lsp.completer import Completer, Cursor, Settings
from lingcode.lsp.early import First, HeldBack, Replay, initialize_result
from lingcode.lsp.wire import MAX_MESSAGE_BYTES, MessageReader, dispatch
from lingcode.regular_file import read_regular_file

STATS = "lingcode/stats"
WORD = re.compile(r"[A-Za-z0-9_]*$")

log = logging.getLogger("lingcode.lsp")


class LingcodeServer(LanguageServer):
    def __init__(self, serve_args: list[str], auto_start: bool):
        super().__init__("lingcode", __version__, text_document_sync_kind=types.TextDocumentSyncKind.Incremental)
        shown = DaemonProgress(self)
        self.link = DaemonLink(serve_args, auto_start, Progress(shown.begin, shown.report, shown.end), timeout=120.0)
        self.completer = Completer(self.link, Settings(), self.log)
        self.last_edit: dict[str, int] = {}  # uri -> the line of its last edit
        self.current_uri: str | None = None
        self.may_notify = False  # LSP: no notification to the client before `initialize`

    def start_io(
        self, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None, first: First | None = None
    ) -> None:
        """pygls' stdio server (as LanguageServer.start_io runs it), reading through wire.py.

        first: what early.answer_initialize read (and perhaps answered) before pygls was imported."""
        self._stop_event = threading.Event()
        stdin, writer = stdin or sys.stdin.buffer, StdoutWriter(stdout or sys.stdout.buffer)
        if first is not None and first.answered_id is not None:  # pygls handles it too, its answer held back
            sent = initialize_result(json.loads(first.body)["params"])
            writer = HeldBack(writer, first, sent)
        elif first is not None:  # not answered: the server reads it as if nothing had
            stdin = Replay(first.raw, stdin)
        self.protocol.set_writer(writer)
        try:
            asyncio.run(self._serve(stdin, first.body if first is not None and first.answered_id is not None else None))
        except BrokenPipeError:
            log.error("the editor closed the connection; shutting down")
        except (KeyboardInterrupt, SystemExit):  # `exit`, as in pygls
            pass
        finally:
            self.shutdown()

    async def _serve(self, stdin: BinaryIO, answered: bytes | None = None) -> None:
        loop = asyncio.get_running_loop()
        reader = MessageReader(stdin, lambda problem: loop.call_soon_threadsafe(self.input_problem, problem))
        if answered is not None:
            dispatch(self.protocol, answered, self.input_problem)
        while not self._stop_event.is_set():
            body = await loop.run_in_executor(self.thread_pool, reader.read)  # blocking reads, off the loop
            if body is None:
                return
            dispatch(self.protocol, body, self.input_problem)

    def input_problem(self, problem: str) -> None:
        """Malformed input: in lingcode's log (stderr), and in the editor's once it may be sent there."""
        log.error("%s", problem)
        if self.may_notify:
            self.log(f"lingcode: {problem}", types.MessageType.Error)

    def log(self, message: str, kind: types.MessageType = types.MessageType.Log) -> None:
        self.window_log_message(types.LogMessageParams(type=kind, message=message))

    async def cursor(
        self, uri: str, position: types.Position, selected: types.SelectedCompletionInfo | None
    ) -> Cursor | None:
        """The document as it is now, with the cursor (and a selected popup item typed in); None if
        the document is neither open nor readable."""
        try:
            doc = await self.document(uri)
        except (OSError, UnicodeDecodeError) as exc:
            self.log(f"lingcode: cannot complete in {uri}: {exc}", types.MessageType.Warning)
            return None
        text = doc.source
        offset = doc.offset_at_position(position)
        line = doc.position_from_client_units(position).line
        if selected is not None:  # complete as if the selected completion item were typed
            start, end = doc.offset_at_position(selected.range.start), doc.offset_at_position(selected.range.end)
            text, offset = text[:start] + selected.text + text[end:], start + len(selected.text)
        root = self.workspace.root_path
        return Cursor(
            uri,
            text,
            offset,
            line,
            self.relative_path(doc.path or uri),
            doc.language_id,
            Path(root).name if root else None,
        )

    async def document(self, uri: str) -> TextDocument:
        """The open document, or an unopened one read from disk: a regular file of at most
        MAX_MESSAGE_BYTES, read on a thread (pygls' own read would block the message loop, for
        ever on a FIFO). OSError or UnicodeDecodeError if it cannot be read."""
        doc = self.workspace.get_text_document(uri)
        if unquote(uri) in self.workspace.text_documents:
            return doc
        if to_fs_path(uri) is None:  # untitled:, or another scheme with nothing on disk
            raise FileNotFoundError(f"{uri} is neither open nor a file")
        data = await asyncio.to_thread(read_regular_file, doc.path, MAX_MESSAGE_BYTES)
        return TextDocument(uri, source=data.decode("utf-8"), position_codec=self.workspace.position_codec)

    def relative_path(self, path: str) -> str:
        root = self.workspace.root_path
        if root:
            try:
                return os.path.relpath(path, root) if Path(path).is_relative_to(root) else path
            except ValueError:
                return path
        return path

    def took_focus(self, uri: str) -> None:
        """Completions moved to `uri`: the file edited before it goes into the context ring."""
        left, self.current_uri = self.current_uri, uri
        if left is not None and left != uri and left in self.last_edit:
            self.add_to_ring(left, self.last_edit[left])

    def add_to_ring(self, uri: str, around_line: int) -> None:
        doc = self.workspace.text_documents.get(uri)
        if doc is not None:
            self.completer.ring.add(uri, self.relative_path(doc.path or uri), doc.source, around_line)


class DaemonProgress:
    """The daemon's start as $/progress where the editor shows progress, else as log messages."""

    def __init__(self, server: LingcodeServer):
        self.server = server
        self.queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self.sender: asyncio.Task | None = None

    def begin(self, message: str) -> None:
        self.queue.put_nowait(("begin", message))
        if self.sender is None or self.sender.done():
            self.sender = asyncio.ensure_future(self._send())

    def report(self, message: str) -> None:
        self.queue.put_nowait(("report", message))

    def end(self, message: str) -> None:
        self.queue.put_nowait(("end", message))

    async def _send(self) -> None:
        """Send in order, once the client has accepted the token (LSP says: not before)."""
        progress, token = self.server.work_done_progress, f"lingcode-daemon-{uuid.uuid4().hex[:8]}"
        window = self.server.client_capabilities.window
        supported = bool(window and window.work_done_progress)
        if supported:
            try:
                await progress.create_async(token)
            except Exception as exc:  # the client refused the token: fall back to log messages
                log.warning("window/workDoneProgress/create failed: %s", exc)
                supported = False
        while True:
            kind, message = await self.queue.get()
            if not supported:
                self.server.log(f"lingcode: {message}", types.MessageType.Info)
            elif kind == "begin":
                progress.begin(token, types.WorkDoneProgressBegin(title="lingcode", message=message))
            elif kind == "report":
                progress.report(token, types.WorkDoneProgressReport(message=message))
            else:
                progress.end(token, types.WorkDoneProgressEnd(message=message))
            if kind == "end":
                return


def build_server(serve_args: list[str] = (), auto_start: bool = True) -> LingcodeServer:
    server = LingcodeServer(list(serve_args), auto_start)

    @server.feature(types.INITIALIZE)
    def initialize(ls: LingcodeServer, params: types.InitializeParams) -> None:
        ls.may_notify = True
        ls.completer.settings, warnings = Settings.from_options(params.initialization_options)
        for warning in warnings:
            ls.log(f"lingcode: {warning}", types.MessageType.Warning)

    @server.feature(types.INITIALIZED)
    def initialized(ls: LingcodeServer, params: types.InitializedParams) -> None:
        ls.link.connect()  # in the background: initialize never waits for the model

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: LingcodeServer, params: types.DidOpenTextDocumentParams) -> None:
        ls.add_to_ring(params.text_document.uri, around_line=0)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: LingcodeServer, params: types.DidChangeTextDocumentParams) -> None:
        for change in params.content_changes:
            if isinstance(change, types.TextDocumentContentChangePartial):
                ls.last_edit[params.text_document.uri] = change.range.start.line

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: LingcodeServer, params: types.DidSaveTextDocumentParams) -> None:
        uri = params.text_document.uri
        ls.add_to_ring(uri, ls.last_edit.get(uri, 0))

    @server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(ls: LingcodeServer, params: types.InlineCompletionParams) -> types.InlineCompletionList:
        uri, selected = params.text_document.uri, params.context.selected_completion_info
        ls.took_focus(uri)
        cursor = await ls.cursor(uri, params.position, selected)
        text = await ls.completer.complete(cursor) if cursor is not None else None
        if not text:
            return types.InlineCompletionList(items=[])
        if selected is not None:  # the item must extend the selected popup item's text
            item = types.InlineCompletionItem(selected.text + text, range=selected.range)
            return types.InlineCompletionList(items=[item])
        here = types.Range(params.position, params.position)
        return types.InlineCompletionList(items=[types.InlineCompletionItem(text, range=here)])

    @server.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions())
    async def completion(ls: LingcodeServer, params: types.CompletionParams) -> types.CompletionList:
        uri = params.text_document.uri
        ls.took_focus(uri)
        cursor = await ls.cursor(uri, params.position, None)
        text = await ls.completer.complete(cursor) if cursor is not None else None
        # Incomplete: the editor asks again as the user types (the typed-ahead cache answers).
        if not text:
            return types.CompletionList(is_incomplete=True, items=[])
        word = WORD.search(cursor.prefix[cursor.prefix.rfind("\n") + 1 :]).group()
        start = types.Position(params.position.line, params.position.character - len(word))
        label = (word + text).split("\n", 1)[0].strip() or text.strip().split("\n", 1)[0]
        shown = types.MarkupContent(types.MarkupKind.Markdown, f"```{cursor.language or ''}\n{word}{text}\n```")
        item = types.CompletionItem(
            label=label,
            kind=types.CompletionItemKind.Text,
            detail="lingcode",
            sort_text="0",
            filter_text=label,
            documentation=shown,
            insert_text_format=types.InsertTextFormat.PlainText,
            text_edit=types.TextEdit(types.Range(start, params.position), word + text),
        )
        return types.CompletionList(is_incomplete=True, items=[item])

    @server.feature(STATS)
    def stats(ls: LingcodeServer, params: object) -> dict:
        daemon = ls.link.daemon
        return {
            **ls.completer.stats.snapshot(),
            "cache_entries": len(ls.completer.cache),
            "context_chunks": len(ls.completer.ring.chunks),
            "documents": [{"uri": uri, "version": doc.version} for uri, doc in ls.workspace.text_documents.items()],
            "daemon": None if daemon is None else {"url": daemon.url, "pid": daemon.pid, "model": daemon.model},
        }

    @server.feature(types.SHUTDOWN)
    async def shutdown(ls: LingcodeServer, params: None) -> None:
        await ls.completer.close()

    return server


def main(serve_args: list[str] = (), auto_start: bool = True, first: First | None = None) -> int:
    """Serve LSP over stdin/stdout until the editor says exit."""
    build_server(serve_args, auto_start).start_io(first=first)
    return 0
