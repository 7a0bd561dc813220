"""Downloads from the Hugging Face Hub (huggingface_hub; HF_ENDPOINT points it at a mirror or a
test server). Weights and tokenizer files only: never code. [tui] adds progress bars, cancel and
disk-space checks on top of this.
"""

from __future__ import annotations

from pathlib import Path

from .errors import SpecchatError

# What a model needs; *.py (remote code) is never fetched.
PATTERNS = ["*.json", "*.safetensors", "*.gguf", "tokenizer*", "*.model", "*.jinja", "*.txt", "pytorch_model*.bin"]


def download(repo_id: str, revision: str | None = None, cache_dir: str | None = None) -> Path:
    """Fetch (or resume) ``repo_id`` into the Hugging Face cache; one-line errors for the usual failures."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (
            GatedRepoError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError:
        raise SpecchatError("downloads need the huggingface_hub package (pip install huggingface_hub)") from None
    try:
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, allow_patterns=PATTERNS))
    except GatedRepoError:
        raise SpecchatError(f"{repo_id} is gated: accept its terms on the Hub and log in (huggingface-cli login)") from None
    except RepositoryNotFoundError:
        raise SpecchatError(f"{repo_id}: no such model on the Hub (or it is private: log in first)") from None
    except RevisionNotFoundError:
        raise SpecchatError(f"{repo_id}: revision {revision!r} not found") from None
    except LocalEntryNotFoundError:
        raise SpecchatError(f"cannot reach the Hugging Face Hub to download {repo_id} (offline?); "
                            "a partial download resumes when you retry") from None
    except OSError as e:
        raise SpecchatError(f"download of {repo_id} failed: {str(e).splitlines()[0][:200]}") from None
