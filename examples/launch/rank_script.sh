# A rank for actorpipe-launch's program tests (run as "sh rank_script.sh MODE"): MODE says what
# it does. Every mode ends on its own within 30 s.
case "$1" in
  hello)
    echo "hello from rank $ACTORPIPE_RANK of $ACTORPIPE_WORLD"
    echo "stderr of rank $ACTORPIPE_RANK" >&2
    ;;
  env)
    echo "coordinator $ACTORPIPE_COORDINATOR secret length ${#ACTORPIPE_JOB_SECRET}"
    ;;
  fail)
    if [ "$ACTORPIPE_RANK" = 1 ]; then exit 3; fi
    exec sleep 30
    ;;
  killed)
    kill -KILL $$
    ;;
  signals)
    trap 'echo "rank $ACTORPIPE_RANK got TERM"; exit 0' TERM
    trap 'echo "rank $ACTORPIPE_RANK got INT"; exit 0' INT
    echo ready
    i=0
    while [ $i -lt 300 ]; do
      sleep 0.1
      i=$((i + 1))
    done
    exit 5
    ;;
  *)
    echo "rank_script.sh: unknown mode '$1'" >&2
    exit 2
    ;;
esac
