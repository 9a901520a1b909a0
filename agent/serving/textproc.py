"""`python -m agent.serving.textproc <descriptor> <agent pid> <memory bytes>`: one process of the agent's text
pool (agent.serving.textpool). It tokenizes prompts and renders chat templates for the daemon, one job at a
time, so that a tokenizer or a template that runs away (a backtracking pre-tokenizer regex, a template that
loops) costs its own request and this process, which the pool kills at the time limit, never the agent's loop.

Jobs and answers are tuples over the connection the agent made (agent.serving.textpool):
  ("load", path)                  -> ("ok", None): read the model's tokenizer and chat template ahead of a job
  ("encode", path, truncate, texts) -> ("ok", [[ids], ...]): with the model's special tokens
  ("chat", path, messages)        -> ("ok", [ids]): the chat template's text, tokenized without adding them again
and ("error", kind, message, param) for a job that failed: kind "input" (the request's fault: a 400), "model"
(the model directory's: a 400 that names it) or "failed" (the tokenizer or template broke on this input).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import sys
from multiprocessing.connection import Connection
from typing import Any

READY = ("ready",)


def serve(conn: Connection) -> None:
    """Answer jobs until the agent closes the connection."""
    from agent.serving.chat import BadChatTemplate, ChatError, ChatTemplates, NoChatTemplate
    from agent.serving.tokenization import NoTokenizer, Tokenizers

    codecs, templates = Tokenizers(), ChatTemplates()
    conn.send(READY)
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        try:
            answer: tuple = ("ok", _run(job, codecs, templates))
        except (NoChatTemplate, BadChatTemplate, NoTokenizer) as e:
            answer = ("error", "model", str(e), getattr(e, "param", "model"))
        except ChatError as e:
            answer = ("error", "input", str(e), e.param)
        except UnicodeError as e:  # a lone surrogate ("\ud800") cannot be encoded to the tokenizer's UTF-8
            answer = ("error", "input", f"the text is not valid Unicode: {e}", None)
        except MemoryError:
            answer = ("error", "failed", "ran out of the memory the agent allows its text processes", None)
        except BaseException as e:  # noqa: BLE001 (a Rust panic is a BaseException: this input broke the tokenizer)
            answer = ("error", "failed", f"{type(e).__name__}: {str(e)[:300]}", None)
        try:
            conn.send(answer)
        except (OSError, ValueError):
            return


def _run(job: tuple, codecs: Any, templates: Any) -> Any:
    kind, path = job[0], job[1]
    if kind == "load":
        codecs.get(path, truncate=False)
        with contextlib.suppress(ValueError):  # no template, or a broken one: said when a chat asks for it
            templates.get(path)
        return None
    if kind == "encode":
        _, _, truncate, texts = job
        for text in texts:
            text.encode("utf-8")  # UnicodeEncodeError naming a lone surrogate; the tokenizer's own error does not
        return codecs.get(path, truncate=truncate).encode(texts)
    if kind == "chat":
        text = templates.render(path, job[2])
        text.encode("utf-8")
        return codecs.get(path, truncate=False).encode_plain(text)  # the template wrote the special tokens
    raise ValueError(f"unknown job {kind!r}")


def _die_with(agent_pid: int) -> None:
    # The kernel kills this process when the agent's thread that spawned it ends (Linux; elsewhere the closed
    # connection ends it at its next job).
    if sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))
    if os.getppid() != agent_pid:
        sys.exit(0)


def main(argv: list[str]) -> None:
    descriptor, agent_pid, memory = int(argv[0]), int(argv[1]), int(argv[2])
    _die_with(agent_pid)
    if memory > 0:
        with contextlib.suppress(ValueError, OSError):  # a template that builds a huge string fails its job alone
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    os.set_inheritable(descriptor, False)
    serve(Connection(descriptor))


if __name__ == "__main__":
    main(sys.argv[1:])
