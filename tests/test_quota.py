"""The user's quota where results/ lies (klstudy.run.quota), and the preflight's disk row that uses it.

The outputs parsed are the formats Lustre's and the quota tools' manuals give (lfs-quota(1): `lfs quota -q -u`;
quota(1): `quota -w`); no Lustre file system is reachable here, so no real `lfs` ran against them.
"""

from types import SimpleNamespace

import yaml
from workflow_helpers import ROOT

from klstudy.config import validate_config
from klstudy.run import preflight, quota

MOUNTS = """\
/dev/sda1 / ext4 rw 0 0
10.0.0.1@o2ib:/scratch /scratch lustre rw,flock 0 0
/dev/sdb1 /home ext4 rw,usrquota 0 0
"""
LFS = "      /scratch  5242880*  4194304  8388608  6d23h59m  12  0  0  -\n"
QUOTA = """\
Disk quotas for user alice (uid 1000):
     Filesystem  blocks   quota   limit   grace   files   quota   limit   grace
      /dev/sdb1  102400       0  512000             100       0       0
"""


def test_the_mount_holding_a_path_is_the_longest_prefix():
    assert quota.mount_of("/scratch/alice/klstudy/results", MOUNTS) == ("10.0.0.1@o2ib:/scratch", "/scratch", "lustre")
    assert quota.mount_of("/scratchpad", MOUNTS)[1] == "/"


def test_lustre_and_the_quota_tools_rows_are_read():
    over = quota.parse_lfs(LFS)  # 5 GiB used, over its 4 GiB soft quota (the *)
    assert (over.used, over.limit, over.left) == (5 * 2**30, 4 * 2**30, 0)
    home = quota.parse_quota(QUOTA, "/dev/sdb1")  # no soft quota (0): the hard limit counts
    assert (home.used, home.limit) == (100 * 2**20, 500 * 2**20)
    assert quota.parse_quota(QUOTA, "/dev/sdc1") is None and quota.parse_lfs("") is None


def test_lfs_is_asked_on_lustre_and_quota_elsewhere():
    asked = []

    def run(command, **_):
        asked.append(command[0])
        return SimpleNamespace(returncode=0, stdout=LFS if command[0] == "lfs" else QUOTA)

    assert quota.user_quota("/scratch/alice/results", run, MOUNTS).tool == "lfs quota" and asked == ["lfs"]
    asked.clear()
    assert quota.user_quota("/home/alice/results", run, MOUNTS).tool == "quota" and asked == ["quota"]


def test_the_disk_row_fails_on_the_quota_where_the_file_system_has_room(tmp_path):
    config = validate_config(yaml.safe_load((ROOT / "config/paper.yaml").read_text()))
    tight = lambda path: quota.Quota("lfs quota", used=0, limit=10**12)  # noqa: E731  (1 TB against a 7 TB peak)
    row = preflight.disk_check(config, tmp_path, quota_of=tight)
    assert row.status == preflight.FAIL and "1,000 GB left of your quota (lfs quota)" in row.detail, row
    row = preflight.disk_check(config, tmp_path, quota_of=lambda path: None)
    assert "no quota tool answered" in row.detail
