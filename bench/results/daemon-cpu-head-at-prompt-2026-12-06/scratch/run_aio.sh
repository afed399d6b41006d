cd /work/main
run() { pkill -f checkedserve.py; sleep 2
  for p in 18781 18782; do h=0; [ $p = $1 ] && h=1; (CHECKED=$h LINGCODE_HOME=/tmp/lh$p nohup .venv/bin/python /tmp/s31/checkedserve.py serve --port $p > /tmp/s31/c$p.log 2>&1 &); done
  sleep 40; if [ $1 = 18781 ]; then SWAP=0; else SWAP=1; fi
  SWAP=$SWAP .venv/bin/python /tmp/s31/ab_aiohttp.py 200 16; }
run 18782 > /tmp/s31/open-aiohttp-ab1.txt 2>&1; run 18781 > /tmp/s31/open-aiohttp-ab2.txt 2>&1; pkill -f checkedserve.py
