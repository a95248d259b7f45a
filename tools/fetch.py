#!/usr/bin/env python3
"""Fetches a pinned build tool once into a per-user cache and prints the path of its binary.

Used by tools/cmake and tools/nasm when the machine has no cmake or nasm (a fresh machine with
only Rust, gcc and Python 3). Every download is pinned by version and SHA-256:

- cmake and ninja: the official PyPI wheels (self-contained Linux binaries), through pip;
- nasm: Debian's amd64 package (one static-enough binary, needs glibc >= 2.34), unpacked here
  without dpkg or root.

The cache is $SLUICE_TOOLS_DIR, else $XDG_CACHE_HOME/sluice-tools, else ~/.cache/sluice-tools.
Once a tool is there, builds use it offline. Concurrent builds take a lock while installing.

Usage: fetch.py cmake|ninja|nasm
"""

import fcntl
import hashlib
import io
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile

WHEELS = {
    # name: (version, path of the binary inside the wheel, accepted SHA-256 per machine)
    "cmake": (
        "3.31.6",
        "cmake/data/bin/cmake",
        {
            "x86_64": "1c8b05df0602365da91ee6a3336fe57525b137706c4ab5675498f662ae1dbcec",
            "aarch64": "42d9883b8958da285d53d5f69d40d9650c2d1bcf922d82b3ebdceb2b3a7d4521",
        },
    ),
    "ninja": (
        "1.13.0",
        "ninja-1.13.0.data/scripts/ninja",
        {
            "x86_64": "fb46acf6b93b8dd0322adc3a4945452a4e774b75b91293bafcc7b7f8e6517dfa",
            "aarch64": "3d00c692fb717fd511abeb44b8c5d00340c36938c12d6538ba989fe764e79630",
        },
    ),
}

NASM_VERSION = "2.16.01"
NASM_DEB = "pool/main/n/nasm/nasm_2.16.01-1_amd64.deb"
NASM_SHA256 = "0180693ad5d2da8b36e7d73b9b596dc3e9f900238e3de699976c0576875b878f"
DEBIAN_MIRROR = os.environ.get("SLUICE_DEBIAN_MIRROR", "https://deb.debian.org/debian")


class FetchError(Exception):
    pass


def cache_dir():
    if os.environ.get("SLUICE_TOOLS_DIR"):
        return os.environ["SLUICE_TOOLS_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "sluice-tools")


def say(message):
    print(f"sluice tools: {message}", file=sys.stderr, flush=True)


def install_wheel(name, staging):
    version, binary, hashes = WHEELS[name]
    machine = platform.machine()
    if machine not in hashes:
        raise FetchError(f"no pinned {name} wheel for machine {machine!r}")
    # pip checks the hash; --only-binary and --no-deps keep it to the one file pinned here.
    requirements = os.path.join(staging, "requirements.txt")
    with open(requirements, "w") as f:
        f.write(f"{name}=={version} --hash=sha256:{hashes[machine]}\n")
    downloads = os.path.join(staging, "download")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--only-binary=:all:", "--require-hashes", "-r", requirements,
         "-d", downloads],
        stdout=sys.stderr,
    )
    if result.returncode != 0:
        raise FetchError(f"pip could not download {name} {version} from PyPI")
    (wheel,) = os.listdir(downloads)
    tree = os.path.join(staging, "tree")
    with zipfile.ZipFile(os.path.join(downloads, wheel)) as archive:
        archive.extractall(tree)
    # Zip files carry no permission bits: everything under the wheel's bin/ is a program.
    bin_dir = os.path.join(tree, os.path.dirname(binary))
    for entry in os.listdir(bin_dir):
        os.chmod(os.path.join(bin_dir, entry), 0o755)
    return tree, binary


def read_ar_member(data, wanted_prefix):
    """The first member of a Unix ar archive (a .deb) whose name starts with wanted_prefix."""
    if not data.startswith(b"!<arch>\n"):
        raise FetchError("the nasm package is not an ar archive")
    offset = 8
    while offset + 60 <= len(data):
        header = data[offset:offset + 60]
        name = header[0:16].decode("ascii").strip().rstrip("/")
        size = int(header[48:58].decode("ascii").strip())
        body = data[offset + 60:offset + 60 + size]
        if name.startswith(wanted_prefix):
            return body
        offset += 60 + size + (size % 2)
    raise FetchError(f"the nasm package has no {wanted_prefix}* member")


def install_nasm(staging):
    if platform.machine() != "x86_64":
        raise FetchError(f"nasm is only needed (and only pinned) for x86_64, not {platform.machine()}")
    url = f"{DEBIAN_MIRROR}/{NASM_DEB}"
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            data = response.read()
    except OSError as e:
        raise FetchError(f"could not download {url}: {e}") from e
    digest = hashlib.sha256(data).hexdigest()
    if digest != NASM_SHA256:
        raise FetchError(f"{url} has SHA-256 {digest}, expected {NASM_SHA256}")
    payload = read_ar_member(data, "data.tar")
    tree = os.path.join(staging, "tree")
    os.makedirs(tree)
    with tarfile.open(fileobj=io.BytesIO(payload), mode="r:*") as archive:
        member = archive.getmember("./usr/bin/nasm")
        source = archive.extractfile(member)
        if source is None:
            raise FetchError("the nasm package's ./usr/bin/nasm is not a file")
        with open(os.path.join(tree, "nasm"), "wb") as out:
            shutil.copyfileobj(source, out)
    os.chmod(os.path.join(tree, "nasm"), 0o755)
    return tree, "nasm"


def ensure(name):
    if name in WHEELS:
        version, binary, _ = WHEELS[name]
    elif name == "nasm":
        version, binary = NASM_VERSION, "nasm"
    else:
        raise FetchError(f"unknown tool {name!r} (cmake, ninja or nasm)")
    root = cache_dir()
    final = os.path.join(root, f"{name}-{version}")
    path = os.path.join(final, binary)
    if os.path.exists(path):
        return path
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(path):  # another build installed it while this one waited
            return path
        say(f"{name} is not installed: fetching {name} {version} into {root} (once)")
        staging = tempfile.mkdtemp(prefix=f".{name}-", dir=root)
        try:
            if name == "nasm":
                tree, binary = install_nasm(staging)
            else:
                tree, binary = install_wheel(name, staging)
            check = subprocess.run([os.path.join(tree, binary), "--version" if name != "nasm" else "-v"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if check.returncode != 0:
                raise FetchError(f"the fetched {name} does not run on this machine")
            os.rename(tree, final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return path


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    name = sys.argv[1]
    try:
        print(ensure(name))
    except (FetchError, OSError) as e:
        say(f"{e}")
        hint = {"cmake": "set CMAKE to one", "ninja": "or make", "nasm": "set ASM_NASM to one"}
        if name in hint:
            say(f"install {name} with the system's package manager (e.g. apt-get install "
                f"{'ninja-build' if name == 'ninja' else name}), or {hint[name]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
