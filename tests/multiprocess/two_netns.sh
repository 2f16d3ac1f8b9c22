# Sourced by the two-host tests: two network namespaces ("hosts") joined by a veth pair, with
# addresses ${net}1 (nsA, device devA) and ${net}2 (nsB, device devB), and an EXIT trap that
# kills every process in `pids` and deletes both namespaces. Without CAP_NET_ADMIN it reports a
# skip (exit 77), never a pass. Usage: source two_netns.sh PREFIX   (PREFIX: 1-2 letters)
id=$$
nsA=ap-$1a-$id
nsB=ap-$1b-$id
devA=$1a$id
devB=$1b$id
net=10.$((200 + id % 50)).$((id / 50 % 250)).
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns del "$nsA" 2>/dev/null || true
  ip netns del "$nsB" 2>/dev/null || true
}
trap cleanup EXIT
if ! ip netns add "$nsA" 2>/dev/null; then
  echo "skipped: needs CAP_NET_ADMIN (ip netns add failed)"
  exit 77
fi
ip netns add "$nsB"
ip link add "$devA" type veth peer name "$devB"
ip link set "$devA" netns "$nsA"
ip link set "$devB" netns "$nsB"
ip -n "$nsA" addr add "${net}1/24" dev "$devA"
ip -n "$nsB" addr add "${net}2/24" dev "$devB"
for ns in "$nsA" "$nsB"; do ip -n "$ns" link set lo up; done
ip -n "$nsA" link set "$devA" up
ip -n "$nsB" link set "$devB" up
