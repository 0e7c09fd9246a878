"""The official openai package works against the server unchanged."""
import openai
import pytest


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused")


def test_sync_chat_and_completions(client):
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hello"}],
                                          max_tokens=12)
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].finish_reason in ("stop", "length")
    assert chat.usage.completion_tokens >= 1 and chat.usage.prompt_tokens > 0
    comp = client.completions.create(model="tiny", prompt="Once upon", max_tokens=9, seed=3, temperature=0.8)
    assert comp.choices[0].finish_reason in ("stop", "length")
    assert 1 <= comp.usage.completion_tokens <= 9
    models = client.models.list()
    assert models.data[0].id == "tiny"


def test_streaming_chat_matches_non_streaming(client):
    kw = dict(model="tiny", messages=[{"role": "user", "content": "Tell me"}], max_tokens=20, seed=5,
              temperature=0.9, extra_body={"ignore_eos": True})
    full = client.chat.completions.create(**kw).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage.completion_tokens == 20 and not chunks[-1].choices


async def test_async_client_streaming_completions(server):
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused")
    stream = await client.completions.create(model="tiny", prompt=[1, 2, 3], max_tokens=10, stream=True,
                                             extra_body={"ignore_eos": True})
    parts = [c.choices[0].text async for c in stream if c.choices]
    comp = await client.completions.create(model="tiny", prompt=[1, 2, 3], max_tokens=10,
                                           extra_body={"ignore_eos": True})
    assert "".join(parts) == comp.choices[0].text


def test_sdk_raises_typed_errors(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=10 ** 6)
    assert "max_tokens" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
