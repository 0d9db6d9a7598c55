#!/bin/bash
# On a lent 1-GPU machine, as root: the deploy's NCCL probe (one rank: NCCL init over the loopback
# bootstrap and all-reduces 8 KiB..64 MiB) in the server unit's sandbox. Files from
# bench/nccl_probe_sandbox_gpu.py in .gpu-probe/ (carried). Writes $OUT/machine.txt and each run's
# JSON. Where PID 1 is systemd: the deploy's own systemd-run command. Elsewhere: the same probe
# argv as the service's user in a network namespace with only `lo` and a private /tmp (HOME):
# that shows NCCL_SOCKET_IFNAME=lo/GLOO_SOCKET_IFNAME=lo suffice with no other interface, not
# that systemd's IP rules and sandbox let it through.
set -u
. .gpu-probe/vars
M=$OUT/machine.txt
{
  date -u; uname -r; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  echo "pid 1: $(ps -p 1 -o comm=)"; systemctl --version 2>&1 | head -1
  python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'
} > "$M" 2>&1
PY=$(command -v python3)
id "$U" >/dev/null 2>&1 || useradd --system --user-group --shell /usr/sbin/nologin --home-dir "$STATE" "$U" >> "$M" 2>&1
mkdir -p "$CFG" "$STATE" && chown "$U:$U" "$STATE" && chmod 750 "$STATE"
# what a release's model code could have left in the account's home: NCCL must not read it
printf 'NCCL_DEBUG=INFO\nNCCL_DEBUG_SUBSYS=ALL\n' > "$STATE/.nccl.conf" && chown "$U:$U" "$STATE/.nccl.conf"
rm -rf "$V" && "$(readlink -f "$PY")" -m venv --without-pip "$V"
SITE=$(python3 -c 'import site; print(site.getsitepackages()[0])')
echo "$SITE" > "$("$V/bin/python" -c 'import site; print(site.getsitepackages()[0])')/machine-torch.pth"
install -m 644 .gpu-probe/nccl_probe.py "$V/nccl_probe.py"
install -m 644 .gpu-probe/nccl.env.next "$CFG/nccl.env.next"
run() {  # LABEL COMMAND...
  local s; s=$(date +%s%N); "${@:2}" > "$OUT/$1.json" 2> "$OUT/$1.err"; local rc=$?
  echo "$1: rc=$rc wall_ms=$(( ($(date +%s%N) - s) / 1000000 )) ok=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d.get("ok"), [r["correct"] for r in d.get("results", [])])' "$OUT/$1.json" 2>/dev/null) nccl_info_lines=$(grep -c 'NCCL INFO' "$OUT/$1.err")" >> "$M"
}
if [ "$(ps -p 1 -o comm=)" = systemd ]; then
  run sandboxed sh .gpu-probe/sandboxed.sh
  run bad-sha sh .gpu-probe/bad.sh
else
  echo "no systemd as PID 1: the probe argv in a network namespace with only lo, private /tmp" >> "$M"
  # lo up and the interfaces listed with python3 (the lent machines have no iproute2)
  LO_UP="import fcntl, socket, struct, sys; s = socket.socket(); f = struct.unpack('16sH14s', fcntl.ioctl(s, 0x8913, struct.pack('16sH14s', b'lo', 0, b'')))[1]; fcntl.ioctl(s, 0x8914, struct.pack('16sH14s', b'lo', f | 1, b'')); print('interfaces:', socket.if_nameindex(), file=sys.stderr)"
  run netns-lo unshare --net --mount sh -c "mount -t tmpfs -o mode=1777 tmpfs /tmp && python3 -c \"$LO_UP\" && setpriv --reuid=$U --regid=$U --clear-groups --no-new-privs -- $(cat .gpu-probe/bare.sh)"
fi
echo "--- left: $(ps -eo args | grep -c '[n]ccl_probe')" >> "$M"
cat "$M"
