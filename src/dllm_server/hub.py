"""Hugging Face model ids -> a local checkpoint folder through `huggingface_hub`. config.json is fetched first,
so a gated, missing or non-diffusion repository fails with one clear line before any weights move."""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)

REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
SERVING_FILES = ["config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
                 "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
                 "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json",
                 "step_predictor.json"]


def is_repo_id(model: str) -> bool:
    """ORG/NAME that is not a local path (a folder that exists always wins)."""
    return bool(REPO_ID.fullmatch(model)) and not Path(model).expanduser().exists()


def download(repo_id: str, check_config: Callable[[dict, str], object], revision: str | None = None,
             cache_dir: str | None = None) -> Path:
    """The snapshot folder of `repo_id` in the HF cache, fetched if needed; ValueError naming the field on failure.
    `check_config(config, repo_id)` vets config.json before any weights are fetched."""
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        RemoteEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError)

    where = f"{repo_id}" + (f" (revision {revision})" if revision else "")
    try:
        cfg_file = hf_hub_download(repo_id, "config.json", revision=revision, cache_dir=cache_dir)
        check_config(json.loads(Path(cfg_file).read_text()), repo_id)
        log.info("fetching %s into the Hugging Face cache (only the files serving needs)", where)
        folder = snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, allow_patterns=SERVING_FILES)
    except GatedRepoError:
        raise ValueError(f"model: {repo_id} is a gated repository: accept its terms on the Hub "
                         "and give a token that has access (HF_TOKEN, or `hf auth login`)") from None
    except RevisionNotFoundError:
        raise ValueError(f"revision: {revision!r} does not exist in {repo_id}") from None
    except RepositoryNotFoundError:
        raise ValueError(f"model: {repo_id} is neither a local folder nor a repository on the Hugging Face Hub "
                         "(a private one needs HF_TOKEN)") from None
    except RemoteEntryNotFoundError:
        raise ValueError(f"model: {where} has no config.json (not a Hugging Face checkpoint)") from None
    except LocalEntryNotFoundError as exc:
        raise ValueError(f"model: {where} is not in the Hugging Face cache and the Hub cannot be used "
                         f"({_first_line(exc)})") from None
    except HfHubHTTPError as exc:
        raise ValueError(f"model: cannot fetch {where} from the Hugging Face Hub ({_first_line(exc)})") from None
    return Path(folder)


def _first_line(exc: Exception) -> str:
    return next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
