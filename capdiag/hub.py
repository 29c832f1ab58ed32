"""`capdiag plan --model ORG/NAME`: a model's config.json, and the exact bytes of its weights,
from the Hugging Face Hub through `huggingface_hub` — so its cache, `HF_TOKEN` and
`HF_HUB_OFFLINE` work as everywhere else. Every failure is one line (InputError)."""
from __future__ import annotations

import os
import re
from typing import Optional

from capdiag import facts as F
from capdiag.errors import InputError
from capdiag.parsing.model_config import model_config_from
from capdiag.side_input import read_json

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


def model_files(repo_id: str) -> tuple[F.ModelConfig, Optional[F.ModelWeights]]:
    """The model's config.json as a fact, and its weights' bytes when the checkpoint has a
    safetensors index (None for a single-file or non-safetensors checkpoint)."""
    if not _REPO_ID.match(repo_id):
        raise InputError(f"--model {repo_id}: a Hugging Face model id is ORG/NAME, e.g. meta-llama/Llama-3.1-8B")
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise InputError("--model needs the huggingface_hub package: pip install 'capdiag[hub]'") from None
    config_path = _download(hf_hub_download, repo_id, CONFIG, required=True)
    config = model_config_from(_json(config_path, repo_id, CONFIG), f"{repo_id} {CONFIG}", source=CONFIG)
    index_path = _download(hf_hub_download, repo_id, INDEX, required=False)
    if index_path is None:
        return config, None
    metadata = _json(index_path, repo_id, INDEX).get("metadata")
    total = metadata.get("total_size") if isinstance(metadata, dict) else None
    if isinstance(total, bool) or not isinstance(total, int) or total <= 0:  # a count of bytes, or nothing
        return config, None
    weights = F.ModelWeights(evidence=F.Evidence(1, f"{repo_id} {INDEX}: metadata.total_size={total}", 0, INDEX),
                             total_bytes=total)
    return config, weights


def _download(hf_hub_download, repo_id: str, filename: str, *, required: bool) -> Optional[str]:
    from huggingface_hub import errors

    try:
        return hf_hub_download(repo_id, filename)
    except errors.GatedRepoError:
        raise InputError(f"--model {repo_id}: a gated model; accept its terms on huggingface.co and set HF_TOKEN "
                         "to a token of that account") from None
    except errors.RepositoryNotFoundError:
        raise InputError(f"--model {repo_id}: no such model on the Hugging Face Hub (a private one needs HF_TOKEN)") \
            from None
    except errors.LocalEntryNotFoundError:
        if not required:
            return None
        raise InputError(f"--model {repo_id}: {filename} is not in the Hugging Face cache and the Hub cannot be "
                         "asked (HF_HUB_OFFLINE is set, or there is no network)") from None
    except errors.EntryNotFoundError:
        if not required:
            return None
        raise InputError(f"--model {repo_id}: the model has no {filename}") from None
    except (errors.HfHubHTTPError, OSError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"--model {repo_id}: the Hugging Face Hub could not be read ({reason})") from None


def _json(path: str, repo_id: str, filename: str) -> dict:
    """A file of the Hub's cache as a JSON object: a regular file (a FIFO or device planted in
    the cache would block or never end), bounded, nested and numbered as any side input."""
    if not os.path.isfile(path):
        raise InputError(f"--model {repo_id}: {filename} in the Hugging Face cache is not a regular file ({path})")
    try:
        data = read_json(path, "config.json" if filename == CONFIG else "safetensors index")
    except InputError as refused:
        raise InputError(f"--model {repo_id}: {filename}: {str(refused).removeprefix(path + ': ')}") from None
    if not isinstance(data, dict):
        raise InputError(f"--model {repo_id}: {filename} is not a JSON object")
    return data
