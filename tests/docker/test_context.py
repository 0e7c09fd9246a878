"""Build context: every COPY/ADD source exists and survives .dockerignore; junk and secrets stay out."""
from __future__ import annotations

import pytest

from .dockerctx import (DOCKERFILES, DOCKERIGNORE, REPO, context_matches, context_sources, is_excluded,
                        load_dockerignore, parse_dockerfile, parse_dockerignore, repo_files)


@pytest.fixture(scope="module")
def ignore():
    assert DOCKERIGNORE.exists(), ".dockerignore is missing at the repository root"
    return load_dockerignore()


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_copy_sources_exist_and_are_in_context(image, ignore):
    sources = context_sources(parse_dockerfile(DOCKERFILES[image]))
    assert sources, f"{image}: no COPY/ADD from the build context?"
    for ins, source in sources:
        assert "://" not in source, f"line {ins.line}: ADD from a URL ({source}); use pinned files instead"
        matches = context_matches(source)
        assert matches and all(m.exists() for m in matches), f"line {ins.line}: {source} does not exist"
        for m in matches:
            rel = m.relative_to(REPO).as_posix()
            assert not is_excluded(rel, ignore), f"line {ins.line}: {rel} is excluded by .dockerignore"
            if m.is_dir():
                # every file the repo ships under a copied folder reaches the image (the embedded
                # demo model's weights under src/dllm_server/assets included)
                files = repo_files(rel)
                assert files, f"{rel}: no files"
                dropped = [f for f in files if is_excluded(f, ignore)]
                assert not dropped, f"files under {rel} dropped by .dockerignore: {dropped[:10]}"


def test_package_sources_reach_the_context(ignore):
    # what `pip install .` needs: the build config, the readme it names, the package
    for path in ("pyproject.toml", "README.md", "src/dllm_server/__init__.py", "src/dllm_server/cli.py"):
        assert (REPO / path).exists(), path
        assert not is_excluded(path, ignore), path


@pytest.mark.parametrize("path", [
    ".venv/bin/python", ".git/HEAD", "runs/demo/model.safetensors", "tests/conftest.py",
    "docker/.env", ".env", "src/dllm_server/__pycache__/cli.cpython-311.pyc",
    "src/dllm_server.egg-info/PKG-INFO", ".pytest_cache/v/cache/lastfailed", "docker/models/x/config.json",
])
def test_junk_and_secrets_stay_out(path, ignore):
    assert is_excluded(path, ignore), f"{path} would be sent to the Docker daemon"


@pytest.mark.parametrize("patterns, path, excluded", [
    ("runs", "runs/a/b.bin", True),
    ("/runs/", "runs", True),
    ("*.md", "docs/deploy.md", False),          # `*` does not cross `/`
    ("**/*.md", "docs/deploy.md", True),
    ("**/*.md", "README.md", True),
    ("*\n!README.md", "README.md", False),
    ("*\n!src", "src/pkg/mod.py", False),
    ("*\n!src\n**/__pycache__", "src/pkg/__pycache__/m.pyc", True),
    ("*\n!docker/healthcheck.py", "docker/healthcheck.py", False),
    ("*\n!docker/healthcheck.py", "docker/Dockerfile", True),
    ("src/*.py", "src/a/b.py", False),
    ("src/?.py", "src/a.py", True),
    ("src/[ab].py", "src/c.py", False),
    ("docs\n!docs/keep.md", "docs/keep.md", False),
])
def test_dockerignore_matcher(patterns, path, excluded):
    assert is_excluded(path, parse_dockerignore(patterns)) is excluded
