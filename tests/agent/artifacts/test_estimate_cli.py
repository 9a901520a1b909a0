"""`python -m agent estimate PATH`: a table, or the JSON breakdown; exit 2 on bad input."""

import json
import subprocess
import sys
from pathlib import Path

from agent.cli import main

ROOT = Path(__file__).resolve().parents[3]
CONFIG = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}


def test_it_prints_the_json_breakdown(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    assert main(["estimate", str(tmp_path), "--dtype", "fp16", "--batch", "2", "--seq", "512", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    keys = {"weights_bytes", "kv_cache_bytes", "activation_bytes", "overhead_bytes", "total_bytes", "parameters",
            "architecture", "notes"}
    assert keys <= body.keys()
    assert (body["parameters"], body["dtype"], body["architecture"]) == (124_439_808, "float16", "GPT2LMHeadModel")
    assert body["kv_cache_bytes"] == 12 * 768 * 2 * 2 * 512 * 2
    assert body["total_bytes"] == sum(body[k] for k in ("weights_bytes", "kv_cache_bytes", "activation_bytes",
                                                        "overhead_bytes"))


def test_it_prints_a_table_by_default(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    assert main(["estimate", str(tmp_path / "config.json"), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "GPT2LMHeadModel (gpt2), 124,439,808 parameters, float32" in out and "kv cache" in out


def test_bad_input_exits_2_with_the_error(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    assert main(["estimate", str(tmp_path), "--dtype", "float13"]) == 2
    assert "dtype 'float13'" in capsys.readouterr().err


def test_it_runs_without_torch_or_django(tmp_path):
    (tmp_path / "config.json").write_text("[1]")
    code = ("import sys; from agent.cli import main; rc = main(['estimate', sys.argv[1]]); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'django', 'transformers'))); "
            "sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 2 and "config.json: must hold a JSON object" in done.stderr
    assert done.stdout.strip() == "[]"
