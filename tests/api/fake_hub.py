"""A local stand-in for the Hugging Face Hub's file API, serving checkpoint folders from disk, so
`huggingface_hub` itself downloads them and lays out its cache exactly as it does for the real
Hub (HF_ENDPOINT points here). Only the calls snapshot_download / hf_hub_download make: repo info,
the file tree, and HEAD/GET of /resolve/. Gated repositories refuse files without the token."""
from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class Repo:
    folder: Path
    commit: str
    gated_token: str | None = None      # gated: files need "Authorization: Bearer <token>"

    def files(self) -> dict[str, Path]:
        return {p.relative_to(self.folder).as_posix(): p for p in sorted(self.folder.rglob("*")) if p.is_file()}


class FakeHub:
    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.requests: list[str] = []           # "METHOD path", for assertions on what was fetched
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, repo_id: str, folder: Path, gated_token: str | None = None) -> Repo:
        commit = hashlib.sha1(repo_id.encode()).hexdigest()
        self.repos[repo_id] = repo = Repo(Path(folder), commit, gated_token)
        return repo

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):     # quiet
                pass

            def do_HEAD(self):
                self._serve(body=False)

            def do_GET(self):
                self._serve(body=True)

            def _send(self, status: int, headers: dict, data: bytes = b"", body: bool = True):
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def _json(self, obj, body: bool):
                self._send(200, {"Content-Type": "application/json"}, json.dumps(obj).encode(), body)

            def _serve(self, body: bool):
                path = self.path.split("?")[0]
                hub.requests.append(f"{self.command} {path}")
                m = (re.fullmatch(r"/api/models/([^/]+/[^/]+)/(revision|tree)/([^/]+)", path)
                     or re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path))
                repo = hub.repos.get(m.group(1)) if m else None
                if repo is None:
                    return self._send(404, {"X-Error-Code": "RepoNotFound"}, b"not found", body)
                revision = m.group(3) if path.startswith("/api/") else m.group(2)
                if revision not in ("main", repo.commit):
                    return self._send(404, {"X-Error-Code": "RevisionNotFound"}, b"no revision", body)
                files = repo.files()
                if path.startswith("/api/") and m.group(2) == "revision":
                    return self._json({"id": m.group(1), "sha": repo.commit, "private": False,
                                       "gated": "manual" if repo.gated_token else False,
                                       "siblings": [{"rfilename": f} for f in files]}, body)
                if path.startswith("/api/"):
                    return self._json([{"type": "file", "path": f, "size": p.stat().st_size,
                                        "oid": hashlib.sha1(p.read_bytes()).hexdigest()} for f, p in files.items()],
                                      body)
                if repo.gated_token and self.headers.get("Authorization") != f"Bearer {repo.gated_token}":
                    return self._send(403, {"X-Error-Code": "GatedRepo", "X-Error-Message": "gated"}, b"gated", body)
                name = m.group(3)
                if name not in files:
                    return self._send(404, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": repo.commit},
                                      b"no such file", body)
                data = files[name].read_bytes()
                self._send(200, {"X-Repo-Commit": repo.commit, "ETag": f'"{hashlib.sha1(data).hexdigest()}"',
                                 "Content-Type": "application/octet-stream"}, data, body)

        return Handler
