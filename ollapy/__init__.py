"""ollapy: a command-line local LLM runner in the Ollama style."""

__version__ = "0.1.0"
