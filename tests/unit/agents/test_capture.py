"""Token-exact capture of an agent episode (``hybridflow.agents.capture``) on the built-in
ChatML tokenizer: a conversation that extends its context appends the template's ids for
the agent's messages to the engine's; a request that does not (edited history, a rewritten
assistant message, a template that drops reasoning once more turns follow) breaks the
segment, split or refused by the rule; the bounds hold."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hybridflow.agents.capture import CaptureLimits, CaptureRefused, EpisodeCapture
from hybridflow.envs.chat_tokens import ChatTokens
from hybridflow.models.builtin import ensure_builtin_model
from hybridflow.models.text_only import load_tokenizer
from hybridflow.types import Completion

DROPS_REASONING = (
    "{% set last_user = namespace(i=-1) %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}{% set last_user.i = loop.index0 %}"
    "{% endif %}{% endfor %}"
    "{% for m in messages %}"
    "{% set content = m['content'] %}"
    "{% if m['role'] == 'assistant' and loop.index0 < last_user.i and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1] %}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""ChatML that, like Qwen3's, drops the reasoning of assistant turns before the last user
turn: not prefix-preserving once a user speaks again."""


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return load_tokenizer(
        ensure_builtin_model("tiny-qwen3", root=Path(tmp_path_factory.mktemp("m")))
    )


def capture(tokenizer, template: str | None = None, **kw) -> EpisodeCapture:
    def render(messages, generation_prompt):
        return tokenizer.apply_chat_template(
            list(messages),
            chat_template=template,
            tokenize=False,
            add_generation_prompt=generation_prompt,
        )

    return EpisodeCapture(ChatTokens(tokenizer), render, **kw)


def answer(cap: EpisodeCapture, tokenizer, text: str, version: int = 5) -> dict:
    """The engine 'generates' ``text`` then EOS; the returned assistant message."""
    ids = np.asarray(tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id])
    completion = Completion(ids, np.full(ids.size, -0.25, np.float32), "stop", version)
    message = {"role": "assistant", "content": text}
    cap.add_generated(completion, message, ids.size)
    return message


def test_an_extending_conversation_is_one_segment_of_exact_ids(tokenizer):
    cap = capture(tokenizer)
    first = [{"role": "user", "content": "2+2?"}]
    prompt = cap.context_for(first)
    reply = answer(cap, tokenizer, "4")
    then = [*first, reply, {"role": "user", "content": "and 3+3?"}]
    context = cap.context_for(then)
    answer(cap, tokenizer, "6", version=6)
    (t,) = cap.trajectories()
    four = tokenizer.encode("4", add_special_tokens=False) + [tokenizer.eos_token_id]
    assert context.tolist()[: prompt.size + len(four)] == [*prompt.tolist(), *four]
    assert tokenizer.decode(context.tolist()) == tokenizer.apply_chat_template(
        then, tokenize=False, add_generation_prompt=True
    )
    assert t.loss_mask.tolist()[: len(four)] == [1] * len(four)
    assert sorted(set(t.token_versions[t.loss_mask == 1].tolist())) == [5, 6]
    assert cap.breaks == {}


@pytest.mark.parametrize(
    ("change", "check"),
    [
        (lambda h: [{"role": "user", "content": "2+3?"}, *h[1:]], "history_changed"),
        (lambda h: [h[0], {"role": "assistant", "content": "5"}, *h[2:]], "history_changed"),
        (
            lambda h: [
                *h,
                {"role": "assistant", "content": "hm"},
                {"role": "user", "content": "?"},
            ],
            "assistant_in_new_messages",
        ),
    ],
)
def test_a_request_that_does_not_extend_the_context_starts_a_segment(tokenizer, change, check):
    cap = capture(tokenizer)
    first = [{"role": "user", "content": "2+2?"}]
    cap.context_for(first)
    history = [*first, answer(cap, tokenizer, "4"), {"role": "user", "content": "sure?"}]
    messages = change(history)
    context = cap.context_for(messages)
    assert cap.breaks == {check: 1}
    assert context.tolist() == tokenizer.encode(
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
        add_special_tokens=False,
    )  # the new segment's prompt: the request rendered whole
    answer(cap, tokenizer, "yes")
    assert len(cap.trajectories()) == 2


def test_a_template_that_drops_reasoning_is_detected_and_split_or_refused(tokenizer):
    for rule in ("split", "refuse"):
        cap = capture(tokenizer, DROPS_REASONING, on_break=rule)
        first = [{"role": "user", "content": "2+2?"}]
        cap.context_for(first)
        reply = answer(cap, tokenizer, "<think>two and two</think>4")
        then = [*first, reply, {"role": "user", "content": "and 3+3?"}]
        if rule == "refuse":
            with pytest.raises(CaptureRefused, match="template_not_prefix"):
                cap.context_for(then)
            continue
        context = cap.context_for(then)
        assert cap.breaks == {"template_not_prefix": 1}
        assert "two and two" not in tokenizer.decode(context.tolist())  # as the template renders
        answer(cap, tokenizer, "6")
        first_segment, second = cap.trajectories()
        assert "two and two" in tokenizer.decode(first_segment.token_ids.tolist())  # kept, trained
    keeps = capture(tokenizer)  # the tokenizer's own ChatML keeps reasoning: no break
    keeps.context_for(first)
    keeps.context_for([*first, answer(keeps, tokenizer, "<think>t</think>4"), then[-1]])
    assert keeps.breaks == {} and len(keeps.segments) == 1


def test_bounds_refuse_the_request(tokenizer):
    cap = capture(tokenizer, limits=CaptureLimits(max_requests=1, max_response_tokens=64))
    first = [{"role": "user", "content": "2+2?"}]
    cap.context_for(first)
    reply = answer(cap, tokenizer, "4")
    with pytest.raises(CaptureRefused, match="max_requests=1"):
        cap.context_for([*first, reply, {"role": "user", "content": "?"}])
    small = capture(tokenizer, limits=CaptureLimits(max_response_tokens=4))
    small.context_for(first)
    reply = answer(small, tokenizer, "4")
    with pytest.raises(CaptureRefused, match="max_response_tokens=4"):
        small.context_for([*first, reply, {"role": "user", "content": "a long question " * 4}])
