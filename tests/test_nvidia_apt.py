"""The driver step's choices that need no host (host/nvidia_apt.py): which repository, which
headers, and which keyring digest a host gets; bad host data is refused with its key named."""

import pytest
from pyinfra.api import DeployError

from dsv4deploy.host import nvidia_apt as N


def test_nvidia_names_its_repositories_by_distribution_and_version():
    assert N.repo_distro({"name": "Ubuntu", "major": 24, "minor": 4}) == "ubuntu2404"
    assert N.repo_distro({"name": "Debian", "major": 12, "minor": None}) == "debian12"


def test_the_running_kernels_headers_and_on_debian_its_flavours_metapackage():
    ubuntu = {"name": "Ubuntu", "major": 24, "minor": 4}
    debian = {"name": "Debian", "major": 12}
    assert N.header_packages(ubuntu, "6.8.0-45-generic") == ["linux-headers-6.8.0-45-generic"]
    assert N.header_packages(debian, "6.1.0-18-amd64") == ["linux-headers-6.1.0-18-amd64", "linux-headers-amd64"]
    assert N.header_packages(debian, "6.1.0-18-cloud-amd64")[1] == "linux-headers-cloud-amd64"
    assert N.header_packages(debian, "6.18.44-fc-v1272") == ["linux-headers-6.18.44-fc-v1272"]   # a custom kernel
    with pytest.raises(DeployError, match="not a kernel version"):
        N.header_packages(debian, "6.1; rm -rf /")


def test_the_keyring_is_nvidias_with_its_pinned_digest_or_a_mirrors_with_the_digest_given():
    url, digest = N.repository({}, "ubuntu2404")
    assert url == f"{N.CUDA_REPOS}/ubuntu2404/x86_64/cuda-keyring_1.1-1_all.deb"
    assert digest == N.KEYRING_SHA256["ubuntu2404"]
    mirror = {"cuda_repo_url": "http://10.0.0.1:8080/cuda/repos/", "cuda_keyring_sha256": "a" * 64}
    assert N.repository(mirror, "debian12") == ("http://10.0.0.1:8080/cuda/repos/debian12/x86_64/"
                                                "cuda-keyring_1.1-1_all.deb", "a" * 64)


@pytest.mark.parametrize("data, message", [
    ({"cuda_repo_url": "http://10.0.0.1/repos"}, "needs cuda_keyring_sha256"),
    ({"cuda_repo_url": "http://x/$(id)", "cuda_keyring_sha256": "a" * 64}, "cuda_repo_url"),
    ({"cuda_repo_url": "http://x/r", "cuda_keyring_sha256": "A" * 64}, "64 lower-case hex"),
])
def test_bad_repository_host_data_is_refused_naming_its_key(data, message):
    with pytest.raises(DeployError, match=message):
        N.repository(data, "debian12")


def test_a_distribution_without_a_pinned_keyring_asks_for_its_digest():
    with pytest.raises(DeployError, match="set host data cuda_keyring_sha256"):
        N.repository({}, "debian11")
