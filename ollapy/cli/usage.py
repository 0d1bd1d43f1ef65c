"""The usage line of every command, as click and Ollama write it: ``pull [OPTIONS] NAME``.

typer 0.28 wraps a required argument in braces in the usage line (``pull [OPTIONS] {name}``), which reads like a
placeholder to fill with braces. :class:`PlainUsageCommand` drops them and writes an argument without a metavar
in capitals.
"""
from __future__ import annotations

import re

import typer
from typer.core import TyperCommand

_PIECE = re.compile(r"^(?:\{(?P<req>[^{}\[\]]+)\}|\[(?P<opt>[^{}\[\]]+)\])(?P<more>\.\.\.)?$")


def plain_piece(piece: str) -> str:
    """One usage piece as click writes it: ``"{name}"`` -> ``"NAME"``, ``"{MODEL}"`` -> ``"MODEL"``,
    ``"{names}..."`` -> ``"NAMES..."``, ``"[text]..."`` -> ``"[TEXT]..."``; anything else (``[OPTIONS]``) as it is."""
    m = _PIECE.match(piece)
    if not m:
        return piece
    inner = m.group("req") or m.group("opt")
    inner = inner.upper() if inner.islower() else inner
    return (inner if m.group("req") else f"[{inner}]") + (m.group("more") or "")


class PlainUsageCommand(TyperCommand):
    """A typer command whose usage line names its arguments without braces (:func:`plain_piece`)."""

    def collect_usage_pieces(self, ctx) -> list[str]:
        return [plain_piece(p) for p in super().collect_usage_pieces(ctx)]


def apply_plain_usage(app: typer.Typer) -> None:
    """Give every command of ``app`` and of its sub-apps that names no class of its own :class:`PlainUsageCommand`."""
    for info in app.registered_commands:
        if info.cls in (None, TyperCommand):
            info.cls = PlainUsageCommand
    for group in app.registered_groups:
        if group.typer_instance is not None:
            apply_plain_usage(group.typer_instance)
