// One push with the unmodified npm `web-push` sender (tests/test_webpush.py): reads a JSON request on
// stdin {subscription, payload_b64, vapid: {subject, publicKey, privateKey}, ttl, topic?, urgency?},
// calls webpush.sendNotification, and prints {statusCode, headers} (or {error, statusCode, headers}).
'use strict';
const webpush = require('web-push');

let input = '';
process.stdin.on('data', (chunk) => { input += chunk; });
process.stdin.on('end', async () => {
  const req = JSON.parse(input);
  const options = {
    TTL: req.ttl,
    vapidDetails: req.vapid,
    contentEncoding: 'aes128gcm',
  };
  if (req.topic) options.topic = req.topic;
  if (req.urgency) options.urgency = req.urgency;
  try {
    const res = await webpush.sendNotification(req.subscription, Buffer.from(req.payload_b64, 'base64'), options);
    process.stdout.write(JSON.stringify({ statusCode: res.statusCode, headers: res.headers }) + '\n');
  } catch (err) {
    process.stdout.write(JSON.stringify({ error: String(err.message || err), statusCode: err.statusCode,
      headers: err.headers, body: err.body }) + '\n');
    process.exitCode = 1;
  }
});
