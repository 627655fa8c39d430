"""`/chat`, the one endpoint callable from outside the page (`gradio_client`, `curl`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import gradio as gr

from app.domain.conversation import Session
from app.domain.sessions import Visit
from app.views.chat import ChatView
from app.views.services import WARNING

CHAT_API = "chat"
MESSAGE_EXAMPLE = {"text": "Say hello.", "files": []}


class ChatApi:
    def __init__(self, chat: ChatView) -> None:
        self.chat = chat

    async def chat_api(
        self,
        message: dict[str, Any],
        model: str,
        system_prompt: str,
        temperature: float | None,
        top_p: float | None,
        max_tokens: float | None,
        seed: float | None,
        request: gr.Request | None = None,
    ) -> AsyncIterator[str]:
        """One message answered by one model, streamed as the growing answer. Parameters in
        the page's order: message ({"text", "files"}), model key, system prompt, temperature,
        top-p, max tokens, seed (0 or None: random). Values left None take the model's
        defaults; bounds are the page's."""
        # Answers running at once count against the script's visitor (its cookie, a new one at
        # each call where it keeps none) and its address (`app.views.fairness`).
        playground = self.chat.playground
        headers = request.headers if request is not None else {}
        visit = Visit(
            chat=Session(),
            counted_as=playground.identity.visitor(headers) or "",
            address=playground.identity.client_of(request),
        )
        try:
            async for update in self.chat.send(
                message, visit, model, system_prompt, temperature, top_p, max_tokens, seed
            ):
                if update[2]:
                    raise gr.Error(update[2].removeprefix(WARNING), print_exception=False)
                if visit.chat.turns and visit.chat.turns[-1].answer:
                    yield visit.chat.turns[-1].answer
        finally:
            visit.close()
            self.chat.playground.forget_api_session(request)

    def layout(self) -> None:
        """Hidden components that carry `/chat`'s values; it goes through the queue like the page."""
        with gr.Group(visible=False):
            message = gr.MultimodalTextbox(file_count="multiple", label="message")
            model, system = gr.Textbox(label="model"), gr.Textbox(label="system_prompt")
            temperature, top_p = gr.Number(label="temperature"), gr.Number(label="top_p")
            max_tokens, seed = gr.Number(label="max_tokens"), gr.Number(label="seed")
            examples = (MESSAGE_EXAMPLE, self.chat.playground.default_model or "", "", 0.7, 1.0, 64, 0)
            inputs = [message, model, system, temperature, top_p, max_tokens, seed]
            for component, example in zip(inputs, examples, strict=True):
                # The API page's example call (Gradio's own was `model="Hello!!"`, which fails).
                component.example_inputs = lambda example=example: example  # type: ignore[method-assign]
            answer = gr.Textbox(label="answer")
            trigger = gr.Button()
        trigger.click(
            self.chat_api,
            inputs,
            [answer],
            api_name=CHAT_API,
        )
