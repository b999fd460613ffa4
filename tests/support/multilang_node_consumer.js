'use strict';
// A record processor of ours for the aws-kcl Node client (its npm package ships no samples), written against the
// client's public API only: require('aws-kcl'), kcl(processor).run(). It does what the client's sample consumer
// does: checkpoint after every batch, at shard end and when a shutdown is requested. Each record and each
// checkpoint answer is appended to the JSON-lines file MULTILANG_JOURNAL.
const fs = require('fs');
const kcl = require('aws-kcl');

const journal = process.env.MULTILANG_JOURNAL;

function note(entry) {
  entry.pid = process.pid;
  fs.appendFileSync(journal, JSON.stringify(entry) + '\n');
}

function processor() {
  let shardId = '?';
  return {
    initialize: function (input, completeCallback) {
      shardId = input.shardId;
      note({ kind: 'message', action: 'initialize', shard: shardId, sequence: input.sequenceNumber });
      completeCallback();
    },
    processRecords: function (input, completeCallback) {
      if (!input || !input.records || input.records.length === 0) {
        completeCallback();
        return;
      }
      for (const record of input.records) {
        const data = Buffer.from(record.data, 'base64').toString();
        note({ kind: 'record', shard: shardId, sequence: record.sequenceNumber, sub: record.subSequenceNumber, data: data });
      }
      const last = input.records[input.records.length - 1].sequenceNumber;
      input.checkpointer.checkpoint(last, function (err) {
        note({ kind: 'checkpoint', shard: shardId, sequence: last, error: err || null });
        completeCallback();
      });
    },
    leaseLost: function (input, completeCallback) {
      note({ kind: 'message', action: 'leaseLost', shard: shardId });
      completeCallback();
    },
    shardEnded: function (input, completeCallback) {
      input.checkpointer.checkpoint(function (err) {
        note({ kind: 'checkpoint', shard: shardId, sequence: null, error: err || null });
        completeCallback();
      });
    },
    shutdownRequested: function (input, completeCallback) {
      input.checkpointer.checkpoint(function (err) {
        note({ kind: 'checkpoint', shard: shardId, sequence: null, error: err || null });
        completeCallback();
      });
    },
  };
}

kcl(processor()).run();
