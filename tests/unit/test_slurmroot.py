"""The test cluster's Slurm root is built once, also when two commands ask for it at once
(``make test`` builds it in the background while the unit tests run, then starts 24.11)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from devcluster.slurmroot import COMPLETE, SlurmRoot


class CountingRoot(SlurmRoot):
    """A root whose build (mmdebstrap, minutes of downloads) is replaced by a slow marker."""

    builds = 0

    def _build(self, log: Path) -> float:
        type(self).builds += 1
        time.sleep(0.5)
        self.path.mkdir(parents=True)
        (self.path / COMPLETE).write_text("test\n")
        return 0.5


def test_two_callers_build_the_root_once(tmp_path):
    CountingRoot.builds = 0
    roots = [CountingRoot(tmp_path / "roots" / "trixie", binds=(tmp_path,)) for _ in range(2)]
    results = []
    threads = [threading.Thread(target=lambda r=r: results.append(r.ensure(tmp_path / "log")))
               for r in roots]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert CountingRoot.builds == 1
    assert sorted(results, key=lambda r: r is None) == [0.5, None]  # the second waited, built nothing
    assert roots[0].complete and roots[1].ensure(tmp_path / "log") is None
