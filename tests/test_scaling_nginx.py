"""docs/scaling.md's nginx block, as scripts/check_scaling.py runs it in front of two replicas: the script can still
read it (one ``upstream ollapy`` with servers, one ``listen``) and, where nginx is installed, nginx accepts the
config made from it (``nginx -t``). The topology itself runs in the script (real replicas, Valkey and nginx)."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _check_scaling():
    spec = importlib.util.spec_from_file_location("check_scaling", ROOT / "scripts" / "check_scaling.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_docs_nginx_block_becomes_a_config_nginx_accepts(tmp_path):
    cs = _check_scaling()
    upstreams = ["127.0.0.1:11501", "127.0.0.1:11502"]
    conf = cs.nginx_conf(ROOT / "docs" / "scaling.md", tmp_path, 11500, upstreams)
    # the doc's servers are replaced by exactly ours, its listen put on loopback; the rest is the doc's text
    assert [ln.split()[1] for ln in conf.splitlines() if ln.strip().startswith("server ") and ":" in ln] \
        == [u + ";" for u in upstreams]
    assert "listen 127.0.0.1:11500;" in conf and conf.count("listen ") == 1
    for directive in ("hash $prefix_key consistent;", "proxy_buffering off;", "proxy_pass http://ollapy;"):
        assert directive in conf
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.access(nginx, os.X_OK):
        pytest.skip("nginx is not installed (apt-get install nginx): the config was not tried")
    prefix = tmp_path / "nginx"
    prefix.mkdir()
    (prefix / "nginx.conf").write_text(conf)
    (tmp_path / "nginx-temp").mkdir()
    p = subprocess.run([nginx, "-t", "-q", "-p", str(prefix), "-e", str(tmp_path / "nginx-error.log"),
                        "-c", str(prefix / "nginx.conf")], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
