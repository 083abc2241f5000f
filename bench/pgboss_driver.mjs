// pg-boss 10 load generator: the same READY/GO protocol and output as bench/driver.py.
//
// node bench/pgboss_driver.mjs '<spec json>'
// Producers call boss.insert() with a batch of jobs; consumers loop on
// boss.fetch(queue, {batchSize}) and boss.complete(queue, ids). One PgBoss instance
// (one pg pool, `max` = producers + consumers connections), no schedulers.
import PgBoss from 'pg-boss'
import readline from 'node:readline'

const QUEUE = 'bench'
const PAYLOAD = { kind: 'bench', body: 'x'.repeat(96) }
const MAX_SAMPLES = 20000

const spec = JSON.parse(process.argv[2])
const batch = Number(spec.batch)

const boss = new PgBoss({
  connectionString: spec.target.url,
  max: Math.max(2, Number(spec.producers || 0) + Number(spec.consumers || 0) + 1),
  supervise: false,
  schedule: false,
  migrate: true
})
boss.on('error', (err) => console.error(err))

async function main () {
  await boss.start()
  if (spec.install) {
    // deleteQueue() leaves the queue's jobs behind when it cannot drop the partition:
    // empty the storage instead, then make sure the queue exists.
    await boss.clearStorage()
    if (!(await boss.getQueue(QUEUE))) await boss.createQueue(QUEUE)
    await boss.stop({ graceful: false, wait: true })
    return
  }
  console.log('READY')
  const line = await new Promise((resolve) => {
    const rl = readline.createInterface({ input: process.stdin })
    rl.once('line', (l) => { rl.close(); resolve(l) })
  })
  const parts = line.trim().split(/\s+/)
  const start = parts.length === 2 ? Number(parts[1]) * 1000 : Date.now()
  const openAt = start + Number(spec.warmup) * 1000
  const closeAt = openAt + Number(spec.duration) * 1000
  const counts = { pushed: 0, popped: 0, acked: 0, empty_pops: 0, errors: 0 }
  const samples = { push: [], pop: [], ack: [] }
  const errors = []
  const cap = Number(spec.backlog_cap || 0) || Infinity
  let outstanding = 0
  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
  const record = (op, started, key, n) => {
    const done = Date.now()
    if (done < openAt || done > closeAt) return
    counts[key] += n
    if (samples[op].length < MAX_SAMPLES) samples[op].push(performance.now() - started)
  }
  const fail = async (err) => {
    counts.errors++
    if (errors.length < 5) errors.push(String(err).slice(0, 300))
    await sleep(50)
  }

  async function producer () {
    while (Date.now() < closeAt) {
      if (outstanding + batch > cap) { await sleep(1); continue }
      const jobs = Array.from({ length: batch }, () => ({ name: QUEUE, data: PAYLOAD }))
      const t = performance.now()
      try { await boss.insert(jobs) } catch (err) { await fail(err); continue }
      outstanding += batch
      record('push', t, 'pushed', batch)
    }
  }

  async function consumer () {
    while (Date.now() < closeAt) {
      let t = performance.now()
      let jobs
      try { jobs = await boss.fetch(QUEUE, { batchSize: batch }) } catch (err) { await fail(err); continue }
      if (!jobs || jobs.length === 0) { counts.empty_pops++; await sleep(2); continue }
      record('pop', t, 'popped', jobs.length)
      t = performance.now()
      try { await boss.complete(QUEUE, jobs.map((j) => j.id)) } catch (err) { await fail(err); continue }
      outstanding -= jobs.length
      record('ack', t, 'acked', jobs.length)
    }
  }

  await sleep(Math.max(0, start - Date.now()))
  const tasks = []
  for (let i = 0; i < Number(spec.producers || 0); i++) tasks.push(producer())
  if (spec.workload === 'e2e') {
    for (let i = 0; i < Number(spec.consumers || 0); i++) tasks.push(consumer())
  }
  await Promise.all(tasks)
  // Wait until the whole line is handed to the pipe: process.exit() would cut it at 64 KiB.
  await new Promise((resolve) => process.stdout.write(JSON.stringify({ counts, samples, errors }) + '\n', resolve))
  await boss.stop({ graceful: false, wait: true })
}

main().then(() => process.exit(0), (err) => { console.error(err); process.exit(1) })
