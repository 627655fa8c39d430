"""The leaderboard tab and its API: the arena's votes as Bradley–Terry scores with bootstrap
intervals (`app.domain.leaderboard`), for every vote or one modality, exported as CSV and JSON."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import gradio as gr

from app.domain.leaderboard import MIN_VOTES, leaderboard, table, to_csv
from app.storage.history import History
from app.views.chat import PRIVATE
from app.views.services import Playground

LEADERBOARD_API = "leaderboard"
ALL = "all"
ROUNDS = 1000
HEADERS = ["Rank", "Model", "Score", "95% interval", "Votes", "Win rate"]
MODALITY_LABELS = {
    ALL: "All votes",
    "text": "Text only",
    "image": "One image",
    "images": "Several images",
    "video": "Video",
}


class LeaderboardView:
    def __init__(self, playground: Playground, history: History) -> None:
        self.playground = playground
        self.history = history
        # The exports are the same for every user: one file per modality, replaced atomically.
        # The folder is removed when the view goes, at the latest as the server exits.
        self._exports = tempfile.TemporaryDirectory(prefix="vlm-playground-leaderboard-")
        self.folder = Path(self._exports.name)

    async def board(self, modality: str) -> dict[str, Any]:
        """The leaderboard as the API and the exports give it."""
        if modality not in MODALITY_LABELS:
            raise gr.Error(
                f"Modality is {modality!r}; use one of: {', '.join(MODALITY_LABELS)}.", print_exception=False
            )
        votes = await asyncio.to_thread(self.history.votes, None if modality == ALL else modality)
        rows = await asyncio.to_thread(leaderboard, votes, ROUNDS)
        names = {key: choice.card.display_name for key, choice in self.playground.choices.items()}
        return {"modality": modality, "votes": len(votes), "rounds": ROUNDS, "rows": table(rows, names)}

    async def refresh(self, modality: str) -> tuple[Any, ...]:
        """The table, a line on what it counts, and the two exports."""
        board = await self.board(modality)
        shown = [
            [
                row["rank"],
                row["name"] if row["name"] == row["model"] else f"{row['name']} ({row['model']})",
                row["score"],
                f"provisional: fewer than {MIN_VOTES} votes"
                if row["provisional"]
                else f"{row['ci_low']} to {row['ci_high']}",
                row["votes"],
                f"{100 * row['win_rate']:.0f}%",
            ]
            for row in board["rows"]
        ]
        votes = board["votes"]
        summary = (
            f"{votes:,} vote{'s' if votes != 1 else ''} ({MODALITY_LABELS[modality].lower()}). Scores are "
            f"Bradley–Terry on the Elo scale with 95% intervals from {ROUNDS:,} bootstrap rounds; ties and "
            "“both bad” count half a win to each side. Models whose intervals overlap share a rank; a "
            f"model with fewer than {MIN_VOTES} votes is provisional and shares the first."
            if votes
            else f"No votes yet ({MODALITY_LABELS[modality].lower()}): battle in the Arena tab."
        )
        csv_path = self.write(f"leaderboard-{modality}.csv", to_csv(board["rows"]))
        json_path = self.write(
            f"leaderboard-{modality}.json", json.dumps(board, indent=2, ensure_ascii=False)
        )
        return (
            gr.Dataframe(value=shown, headers=HEADERS),
            summary,
            gr.DownloadButton(value=str(csv_path), interactive=bool(votes)),
            gr.DownloadButton(value=str(json_path), interactive=bool(votes)),
        )

    def write(self, name: str, text: str) -> Path:
        target = self.folder / name
        with tempfile.NamedTemporaryFile("w", dir=self.folder, delete=False, encoding="utf-8") as out:
            out.write(text)
        os.replace(out.name, target)
        return target

    # --- layout ------------------------------------------------------------------------------

    def layout(self) -> tuple[gr.Radio, list[Any]]:
        """The tab; returns the modality picker and what a refresh updates."""
        modality = gr.Radio(
            [(label, key) for key, label in MODALITY_LABELS.items()],
            value=ALL,
            label="Votes counted",
            elem_id="leaderboard-modality",
        )
        summary = gr.Markdown(elem_id="leaderboard-summary")
        board = gr.Dataframe(headers=HEADERS, interactive=False, elem_id="leaderboard-table", wrap=True)
        with gr.Row():
            export_csv = gr.DownloadButton(
                "Export CSV", elem_id="leaderboard-csv", interactive=False, size="sm"
            )
            export_json = gr.DownloadButton(
                "Export JSON", elem_id="leaderboard-json", interactive=False, size="sm"
            )
            again = gr.Button("Refresh", elem_id="leaderboard-refresh", size="sm")
        outputs = [board, summary, export_csv, export_json]
        for event in (modality.change, again.click):
            event(self.refresh, [modality], outputs, show_progress="hidden", **PRIVATE)
        return modality, outputs

    def api(self) -> None:
        """`/leaderboard`: the table for one modality ("all", "text", "image", "images", "video")."""
        with gr.Group(visible=False):
            modality = gr.Textbox(label="modality", value=ALL)
            modality.example_inputs = lambda: ALL  # type: ignore[method-assign]
            answer = gr.JSON(label="leaderboard")
            trigger = gr.Button()
        trigger.click(self.board_api, [modality], [answer], api_name=LEADERBOARD_API)

    async def board_api(self, modality: str, request: gr.Request | None = None) -> dict[str, Any]:
        """`/leaderboard`'s answer: `board`, and nothing left behind for the call's session."""
        try:
            return await self.board(modality)
        finally:
            self.playground.forget_api_session(request)
