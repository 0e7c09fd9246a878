"""The pure parts behind issue 17's limits: the watchdog's bookkeeping, the bounded stream buffer,
the cheap prompt-length bound, and the body decoding and caps of the API."""
import asyncio

import pytest

from dllm_server.api.body import Limits, check_limits, parse_body
from dllm_server.api.errors import APIError
from dllm_server.api.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest
from dllm_server.config import ServerConfig
from dllm_server.request.inputs import check_prompt_chars, input_chars
from dllm_server.request.events import StreamEvent
from dllm_server.request.stream_buffer import StreamBuffer
from dllm_server.executor.watchdog import Watchdog
from dllm_server.messages import LoadReport, StepDelta


def report(busy: bool, handled: int) -> LoadReport:
    return LoadReport(0, 0, 0, 10, 0, 0, 1, busy=busy, messages_handled=handled)


def test_watchdog_owes_a_report_for_unhandled_messages_and_for_busy_workers():
    w = Watchdog(2, timeout_s=5)
    assert w.stuck(100) == []                       # idle and nothing sent: never stuck
    w.on_sent(0, 10)
    assert w.stuck(15) == [] and w.stuck(15.1) == [0]
    w.on_batch(0, [report(busy=True, handled=1)], 15)     # progress restarts the clock
    assert w.stuck(20) == [] and w.stuck(20.1) == [0]
    w.on_batch(0, [report(busy=False, handled=1)], 20)    # done: nothing owed however long
    assert w.stuck(1000) == []


def test_watchdog_does_not_miss_a_message_sent_while_a_report_was_in_flight():
    w = Watchdog(1, timeout_s=5)
    w.on_sent(0, 0)
    w.on_sent(0, 1)
    w.on_batch(0, [report(busy=False, handled=1)], 2)     # covers only the first message
    assert w.stuck(7.1) == [0]


def test_watchdog_counts_any_message_as_progress_and_forgets_a_restarted_worker():
    w = Watchdog(1, timeout_s=5)
    w.on_sent(0, 0)
    w.on_batch(0, [StepDelta("r", 0, 0, (), (), 1)], 4)   # a mid-turn emit (KVSent-like): progress
    assert w.stuck(8) == [] and w.stuck(9.1) == [0]
    w.reset(0)
    assert w.stuck(100) == []
    assert Watchdog(1, timeout_s=0).stuck(1e9) == []


def _text(t):
    return StreamEvent("r", text=t)


def _progress():
    return StreamEvent("r", delta=StepDelta("r", 0, 0, (), (), 1))


async def test_stream_buffer_coalesces_text_and_bounds_progress():
    overflowed = []
    b = StreamBuffer(3, lambda: overflowed.append(1))
    for t in ("a", "ab", "abc"):
        b.put_nowait(_text(t))
    assert b.qsize() == 1 and (await b.get()).text == "abc"
    for _ in range(5):
        b.put_nowait(_progress())
    assert b.qsize() == 3 and b.overflowed
    await asyncio.sleep(0)
    assert overflowed == [1]                       # once, and not from inside put_nowait
    b.put_nowait(StreamEvent("r", output=object()))      # the final output is always kept
    assert b.qsize() == 4


async def test_stream_buffer_get_waits_for_a_put():
    b = StreamBuffer(4)
    got = asyncio.ensure_future(b.get())
    await asyncio.sleep(0)
    assert not got.done()
    b.put_nowait(_text("x"))
    assert (await got).text == "x"


def test_cheap_length_bound():
    check_prompt_chars(1024 * 19 * 4, 1024, 19, "prompt")
    with pytest.raises(ValueError, match="prompt: .* characters cannot fit"):
        check_prompt_chars(1024 * 19 * 4 + 1, 1024, 19, "prompt")
    assert input_chars("abc", None) == 3 and input_chars({"prompt_token_ids": [1]}, None) == 0
    assert input_chars(None, [{"role": "user", "content": "  hi  "}, {"role": "user", "content": "yo"}]) == 4


LIMITS = Limits.from_config(ServerConfig())


@pytest.mark.parametrize("body,msg", [
    (b"{nope", "not valid JSON"), (b"[1]", "must be a JSON object"), (b"", "must be a JSON object"),
    (b'{"prompt": "\xff"}', "not valid JSON"), (b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", ""),
    (b'{"prompt": 3}', "prompt"),
])
def test_every_malformed_body_is_a_400(body, msg):
    with pytest.raises(APIError) as e:
        parse_body(body, CompletionRequest)
    assert e.value.status == 400 and msg in e.value.message


def test_a_good_body_parses():
    assert parse_body(b' {"prompt": "hi", "max_tokens": 3}', CompletionRequest).max_tokens == 3


@pytest.mark.parametrize("body,param", [
    ({"messages": [{"role": "user", "content": "a"}] * 513}, "messages"),
    ({"messages": [{"role": "user", "content": "a"}], "stop": ["s"] * 17}, "stop"),
    ({"messages": [{"role": "user", "content": "a"}], "stop": "s" * 257}, "stop"),
])
def test_caps_name_the_field(body, param):
    with pytest.raises(APIError) as e:
        check_limits(ChatCompletionRequest.model_validate(body), LIMITS)
    assert e.value.status == 400 and e.value.param == param


def test_caps_let_the_largest_allowed_through():
    check_limits(ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "a"}] * 512,
                                                       "stop": ["s" * 256] * 16}), LIMITS)
    check_limits(CompletionRequest.model_validate({"prompt": [[1, 2]] * 256}), LIMITS)
    with pytest.raises(APIError):
        check_limits(CompletionRequest.model_validate({"prompt": ["a"] * 257}), LIMITS)
    check_limits(DetokenizeRequest.model_validate({"tokens": [1]}), LIMITS)   # none of the capped fields


@pytest.mark.parametrize("field", ["max_request_body_bytes", "max_messages", "stream_buffer_events",
                                   "stream_stall_timeout_s", "body_read_timeout_s"])
def test_limit_fields_are_validated(field):
    with pytest.raises(ValueError, match=field):
        ServerConfig(**{field: 0})


async def test_keep_alive_closes_its_source_while_a_read_is_pending():
    """A client that leaves mid-stream closes the SSE generator while its source is being read
    in another task: closing used to raise 'aclose(): asynchronous generator is already running'."""
    from dllm_server.api import sse
    closed = []

    async def source():
        try:
            yield b"first"
            await asyncio.sleep(3600)
            yield b"never"
        finally:
            closed.append(True)
    out = sse.with_keep_alive(source(), interval_s=0.01)
    assert await out.__anext__() == b"first"
    assert await out.__anext__() == sse.KEEP_ALIVE      # the second read is pending now
    await out.aclose()
    assert closed == [True]
