//! Redis with `appendonly yes` and `appendfsync always`: every write is in the append-only
//! file and fsynced before the reply (Redis syncs once per event-loop turn, so concurrent
//! clients share a sync, the group commit idemstore does too).
//!
//! The benchmark starts its own `redis-server` on a free loopback port with its data in the
//! run's directory, and kills it when the engine is dropped. A machine without the binary
//! skips this engine (see [`Engine::available`]); `REDIS_SERVER` names another binary.
//!
//! A reserve is `SET key fp NX`; on a duplicate a `GET` reads the stored fingerprint back and
//! compares it, as an idempotency layer must. A completion is a `SET` of fingerprint, state and
//! result. `reserve_many` is a pipeline of `SET NX` (one round trip), then one pipeline of
//! `GET`s for the keys that were there.

use std::io::ErrorKind;
use std::net::{Ipv4Addr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::Value;

use super::{context, BenchKey, BenchResult, Engine, Handle};

const PENDING: u8 = 0;
const COMPLETED: u8 = 1;

/// How long a starting server may take to answer `PING`.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The server binary: `REDIS_SERVER`, or `redis-server` on the `PATH`.
fn binary() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_string())
}

/// A `redis-server` this benchmark started; killed on drop.
pub struct Redis {
    url: String,
    child: Mutex<Child>,
}

impl Drop for Redis {
    fn drop(&mut self) {
        let child = self
            .child
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Already gone is fine: the point is that no server outlives the benchmark.
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A port that was free a moment ago (the server may still lose a race for it: then
/// [`Redis::open`] tries another).
fn free_port() -> BenchResult<u16> {
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(context("redis: free port"))?;
    Ok(listener
        .local_addr()
        .map_err(context("redis: free port"))?
        .port())
}

/// Starts a server on `port` with its files in `dir`, and waits until it answers.
fn start(dir: &Path, port: u16) -> BenchResult<Redis> {
    let child = Command::new(binary())
        .arg("--port")
        .arg(port.to_string())
        .args(["--bind", "127.0.0.1", "--protected-mode", "yes"])
        .arg("--dir")
        .arg(dir)
        .args(["--appendonly", "yes", "--appendfsync", "always"])
        // No RDB snapshots: the append-only file alone makes writes durable.
        .args(["--save", ""])
        .args(["--daemonize", "no", "--logfile", "redis.log"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(context("redis: starting redis-server"))?;
    let server = Redis {
        url: format!("redis://127.0.0.1:{port}/"),
        child: Mutex::new(child),
    };
    let client = redis::Client::open(server.url.as_str()).map_err(context("redis: client"))?;
    let started = Instant::now();
    loop {
        let exited = server
            .child
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .try_wait()
            .map_err(context("redis: waiting for redis-server"))?;
        if let Some(status) = exited {
            return Err(format!(
                "redis: redis-server exited at start ({status}); see {}",
                dir.join("redis.log").display()
            )
            .into());
        }
        let pong = client
            .get_connection_with_timeout(Duration::from_millis(200))
            .and_then(|mut conn| redis::cmd("PING").query::<String>(&mut conn));
        if pong.is_ok() {
            return Ok(server);
        }
        if started.elapsed() > START_TIMEOUT {
            return Err(format!(
                "redis: redis-server on port {port} did not answer within {START_TIMEOUT:?}"
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Redis {
    /// A new connection to the server (the steady-state scenario's own commands).
    pub fn connection(&self) -> BenchResult<redis::Connection> {
        redis::Client::open(self.url.as_str())
            .map_err(context("redis: client"))?
            .get_connection()
            .map_err(context("redis: connect"))
    }
}

impl Engine for Redis {
    const NAME: &'static str = "redis";
    /// Pipelines from several connections share the server's syncs.
    const FILL_THREADS: usize = 4;
    type Handle = RedisHandle;

    fn available() -> Result<(), String> {
        let bin = binary();
        match Command::new(&bin).arg("--version").output() {
            Ok(out) if out.status.success() => Ok(()),
            Ok(out) => Err(format!("`{bin} --version` failed ({})", out.status)),
            Err(e) if e.kind() == ErrorKind::NotFound => Err(format!(
                "`{bin}` is not installed; install it with `apt-get install redis-server` \
                 (Debian/Ubuntu) or `brew install redis`, or set REDIS_SERVER to its path"
            )),
            Err(e) => Err(format!("cannot run `{bin}`: {e}")),
        }
    }

    fn open(dir: &Path) -> BenchResult<Self> {
        let mut last = None;
        for _ in 0..3 {
            match start(dir, free_port()?) {
                Ok(server) => return Ok(server),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("three attempts"))
    }

    fn handle(&self) -> BenchResult<RedisHandle> {
        let client = redis::Client::open(self.url.as_str()).map_err(context("redis: client"))?;
        let conn = client.get_connection().map_err(context("redis: connect"))?;
        Ok(RedisHandle(conn))
    }
}

fn value(key: &BenchKey, state: u8, result: &[u8]) -> Vec<u8> {
    let mut value = Vec::with_capacity(33 + result.len());
    value.extend_from_slice(&key.fingerprint());
    value.push(state);
    value.extend_from_slice(result);
    value
}

/// Whether a `SET … NX` reply says the key was set (`OK`) or was there (nil).
fn was_set(key: &BenchKey, reply: &Value) -> BenchResult<bool> {
    match reply {
        Value::Okay => Ok(true),
        Value::Nil => Ok(false),
        other => Err(format!("redis: SET NX of {key} answered {other:?}").into()),
    }
}

/// Checks a duplicate's stored value against the request's fingerprint.
fn check_stored(key: &BenchKey, stored: &Value) -> BenchResult<()> {
    match stored {
        Value::BulkString(bytes) if bytes.get(..32) == Some(&key.fingerprint()[..]) => Ok(()),
        Value::BulkString(_) => {
            Err(format!("redis: {key} is stored with another fingerprint").into())
        }
        Value::Nil => Err(format!("redis: {key} was there for SET NX but not for GET").into()),
        other => Err(format!("redis: GET of {key} answered {other:?}").into()),
    }
}

/// A thread's own connection.
pub struct RedisHandle(redis::Connection);

impl Handle for RedisHandle {
    type Lease = ();

    fn reserve(&mut self, key: &BenchKey) -> BenchResult<Option<()>> {
        let reply: Value = redis::cmd("SET")
            .arg(&key.flat()[..])
            .arg(value(key, PENDING, &[]))
            .arg("NX")
            .query(&mut self.0)
            .map_err(context("redis: SET NX"))?;
        if was_set(key, &reply)? {
            return Ok(Some(()));
        }
        let stored: Value = redis::cmd("GET")
            .arg(&key.flat()[..])
            .query(&mut self.0)
            .map_err(context("redis: GET"))?;
        check_stored(key, &stored)?;
        Ok(None)
    }

    fn complete(&mut self, key: &BenchKey, _lease: (), result: &[u8]) -> BenchResult<()> {
        let reply: Value = redis::cmd("SET")
            .arg(&key.flat()[..])
            .arg(value(key, COMPLETED, result))
            .query(&mut self.0)
            .map_err(context("redis: SET"))?;
        match reply {
            Value::Okay => Ok(()),
            other => Err(format!("redis: SET of {key} answered {other:?}").into()),
        }
    }

    fn reserve_many(&mut self, keys: &[BenchKey]) -> BenchResult<usize> {
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.cmd("SET")
                .arg(&key.flat()[..])
                .arg(value(key, PENDING, &[]))
                .arg("NX");
        }
        let replies: Vec<Value> = pipe
            .query(&mut self.0)
            .map_err(context("redis: pipelined SET NX"))?;
        let mut new = 0;
        let mut there = Vec::new();
        for (key, reply) in keys.iter().zip(&replies) {
            if was_set(key, reply)? {
                new += 1;
            } else {
                there.push(key);
            }
        }
        if !there.is_empty() {
            let mut pipe = redis::pipe();
            for key in &there {
                pipe.cmd("GET").arg(&key.flat()[..]);
            }
            let stored: Vec<Value> = pipe
                .query(&mut self.0)
                .map_err(context("redis: pipelined GET"))?;
            for (key, stored) in there.into_iter().zip(&stored) {
                check_stored(key, stored)?;
            }
        }
        Ok(new)
    }

    fn fill(&mut self, keys: &[BenchKey], result: &[u8]) -> BenchResult<()> {
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.cmd("SET")
                .arg(&key.flat()[..])
                .arg(value(key, COMPLETED, result))
                .arg("NX");
        }
        let replies: Vec<Value> = pipe
            .query(&mut self.0)
            .map_err(context("redis: pipelined fill"))?;
        for (key, reply) in keys.iter().zip(&replies) {
            if !was_set(key, reply)? {
                return Err(format!("redis: prefill: {key} was already stored").into());
            }
        }
        Ok(())
    }
}
