import time
rows = []
for step in range(6):
    rows.extend(str(i) * 8 for i in range(120_000))   # strings, list growth
    time.sleep(0.1)
index = {r: len(r) for r in rows[:300_000]}          # a dict
time.sleep(0.3)
del rows
time.sleep(0.2)
del index
time.sleep(0.2)
