"""The benchmark that grows every night (bugsweep.mining.growing, the grow-benchmark flow).

Real parts: a real git repository built by the test that receives new commits between two nights, real mining in
the local sandbox (bubblewrap) with real pytest, the flow run on a real Prefect API server (the session's test
server), the benchmark in a real S3 server (SeaweedFS) through prefect-aws blocks. No model is involved.
"""

from __future__ import annotations

import json
import shutil
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bugsweep.mining.growing import BenchmarkRepo, added_within
from bugsweep.spec import parse_tasks
from tests.support.repos import commit_all, git, make_repo, write_files

pytest_plugins = ["tests.support.prefect_server", "tests.support.seaweed"]
pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="the local sandbox needs bubblewrap")

CALC = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
TEST_MUL = "from calc import mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"
PYPROJECT = '[tool.pytest.ini_options]\npythonpath = ["."]\n'


def fix(repo: Path, old: str, new: str, test_name: str, test: str, message: str) -> str:
    write_files(repo, {
        "calc.py": (repo / "calc.py").read_text().replace(old, new),
        f"tests/{test_name}.py": test,
    })  # fmt: skip
    return commit_all(repo, message)


@pytest.fixture
def bucket(prefect_harness: None, seaweed: Any) -> Any:
    """A saved prefect-aws S3Bucket block on a new SeaweedFS bucket, as a team's store."""
    from prefect_aws import AwsCredentials, S3Bucket
    from prefect_aws.client_parameters import AwsClientParameters
    from pydantic import SecretStr

    from tests.support.seaweed import ACCESS_KEY, SECRET_KEY

    suffix = uuid.uuid4().hex[:8]
    credentials = AwsCredentials(
        aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SecretStr(SECRET_KEY),
        aws_client_parameters=AwsClientParameters(endpoint_url=seaweed.endpoint_url),
    )  # fmt: skip
    credentials.save(f"aws-{suffix}")
    S3Bucket(
        bucket_name=seaweed.new_store(prefix="").bucket, bucket_folder="team", credentials=credentials
    ).save(f"store-{suffix}")
    return S3Bucket.load(f"store-{suffix}")


def test_two_nights_with_new_commits_between_append_only_the_new_fixes(bucket: Any, tmp_path: Path) -> None:
    from blocks import bucket_store
    from flows.grow import grow

    repo = make_repo(
        tmp_path / "calc", {"calc.py": CALC, "tests/test_mul.py": TEST_MUL, "pyproject.toml": PYPROJECT}
    )
    first = fix(repo, "a - b", "a + b", "test_add", "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
                "Fix add() returning the difference")  # fmt: skip
    sources = [BenchmarkRepo(repo=str(repo), setup_command="pip install pytest", first_since="2000-01-01")]
    store = bucket_store(bucket)

    night1 = grow(repos=sources, store=bucket, runs=1)
    assert [len(g.added) for g in night1] == [1] and night1[0].since_head is None
    after_night1 = store.get_bytes("benchmark/tasks.jsonl")
    (task1,) = parse_tasks(after_night1.decode())
    assert task1.fix_commit == first and task1.FAIL_TO_PASS == ["tests/test_add.py::test_add"]
    assert task1.added_at

    # The next day: one more fix, and a commit that is no fix.
    write_files(repo, {"README.md": "calc\n"})
    commit_all(repo, "Describe the project")
    second = fix(repo, "return a * b", "return a * b if a is not None else None", "test_none",
                 "from calc import mul\n\n\ndef test_none():\n    assert mul(None, 2) is None\n",
                 "Fix mul() crashing on None")  # fmt: skip
    night2 = grow(repos=sources, store=bucket, runs=1)
    assert night2[0].since_head == night1[0].head and night2[0].head != night1[0].head
    assert night2[0].candidates == 2, "only the commits since the last night are mined"
    after_night2 = store.get_bytes("benchmark/tasks.jsonl")
    assert after_night2.startswith(after_night1), "what the first night kept is never rewritten"
    tasks = parse_tasks(after_night2.decode())
    assert [t.fix_commit for t in tasks] == [first, second]

    # A third night with nothing new adds nothing and leaves the file as it was.
    night3 = grow(repos=sources, store=bucket, runs=1)
    assert night3[0].added == [] and store.get_bytes("benchmark/tasks.jsonl") == after_night2
    state = json.loads(store.get_bytes("benchmark/tasks.jsonl.state.json"))
    assert state["repos"][str(repo.resolve())]["head"] == night2[0].head

    # The state lost (a night that died before writing it): the range is mined again, nothing is added twice
    bucket.credentials.get_s3_client().delete_object(
        Bucket=bucket.bucket_name, Key=f"{bucket.bucket_folder}/benchmark/tasks.jsonl.state.json"
    )
    again = grow(repos=sources, store=bucket, runs=1)
    assert again[0].added == [] and sorted(again[0].already_there) == sorted([first, second])
    assert store.get_bytes("benchmark/tasks.jsonl") == after_night2

    # A night whose only fix is the second one backported to a maintenance branch merged back: the same change,
    # already in the benchmark, is not added again
    git(repo, "checkout", "-q", "-b", "maintenance/1.x", first)
    git(repo, "cherry-pick", "-x", second)
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--no-ff", "maintenance/1.x", "-m", "Merge branch 'maintenance/1.x'")
    night4 = grow(repos=sources, store=bucket, runs=1)
    assert night4[0].candidates == 1 and night4[0].added == [] and night4[0].stopped is None
    assert store.get_bytes("benchmark/tasks.jsonl") == after_night2

    # The comparison of the recent bugs: tasks added in the last N days
    later = datetime.fromisoformat(tasks[1].added_at or "") + timedelta(days=3)
    assert [t.fix_commit for t in added_within(tasks, 7, now=later)] == [first, second]
    assert added_within(tasks, 1, now=later) == []
    assert datetime.fromisoformat(tasks[0].added_at or "").tzinfo == UTC
