"""The typer command-line app. Must not import llama_cpp at import time (fast start)."""
