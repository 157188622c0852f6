"""Compiling a request's grammar before it is submitted: on a worker thread, under a time limit.

The engine's `prepare_grammar` compiles into its cache (core/structured/compiler.py); the engine
thread then only copies the cached matcher. A schema that cannot be compiled is a 400 naming its
field; one whose compile outlasts `structured.compile_timeout_s` is a 400 too (the compile itself is
bounded by llguidance's fuel limits, so the worker it leaves behind ends soon after).
"""

from __future__ import annotations

import asyncio

from rillet.core.structured.spec import INSTALL_HINT, GrammarError, GrammarSpec, GrammarUnavailable
from rillet.http.engine_api import EngineLike
from rillet.http.openai.errors import ApiError, bad_request
from rillet.http.openai.protocol import GenRequest


async def prepare_grammars(gen: GenRequest, engine: EngineLike, timeout_s: float) -> None:
    if gen.grammar is not None:
        await _prepare(engine, gen.grammar, timeout_s)
    if gen.tool_check is not None:  # tool_choice auto: the tools' schemas must compile too
        try:
            await _prepare(engine, gen.tool_check, timeout_s)
        except ApiError as exc:
            if exc.code != "structured_outputs_unavailable":  # auto needs no grammar engine
                raise


async def _prepare(engine: EngineLike, spec: GrammarSpec, timeout_s: float) -> None:
    prepare = getattr(engine, "prepare_grammar", None)
    if prepare is None:
        raise _unavailable(spec.param, INSTALL_HINT)
    loop = asyncio.get_running_loop()
    try:
        await asyncio.wait_for(loop.run_in_executor(None, prepare, spec), timeout_s)
    except GrammarUnavailable as exc:
        raise _unavailable(exc.param, exc.message) from exc
    except GrammarError as exc:
        raise bad_request(f"'{exc.param}' {exc.message}", param=exc.param, code="invalid_schema") from exc
    except TimeoutError as exc:
        raise bad_request(
            f"'{spec.param}' is too complex: its grammar did not compile within {timeout_s:g} s "
            "(structured.compile_timeout_s)",
            param=spec.param,
            code="grammar_too_complex",
        ) from exc


def _unavailable(param: str, message: str) -> ApiError:
    return bad_request(f"'{param}': {message}", param=param, code="structured_outputs_unavailable")
