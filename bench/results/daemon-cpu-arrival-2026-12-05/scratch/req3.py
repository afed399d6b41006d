import httpx, json, time, sys, asyncio
tok=open('/tmp/lh/config/token').read().strip()
short={"messages":[{"role":"user","content":"Write a Python function that reverses a string."}]}
async def main():
    async with httpx.AsyncClient(base_url="http://127.0.0.1:8931", headers={"Authorization": f"Bearer {tok}"}, timeout=60) as c:
        for i in range(int(sys.argv[1])):
            body=dict(short, max_tokens=16, stream=True, temperature=0, ignore_eos=True)
            async with c.stream("POST","/v1/chat/completions",json=body) as r:
                async for line in r.aiter_lines(): pass
            await asyncio.sleep(0.05)
asyncio.run(main())
