/** An argument of a command. */
export type Arg = string | number | Buffer;
/** What this package needs of a connection. */
export interface Conn {
    /** Sends one command; its reply. */
    send(args: Arg[]): Promise<unknown>;
    /** `host:port` (or the cluster), for messages. */
    readonly name: string;
}
/** A connection of its own for a blocking wait (a BLOCKed command holds its
 * connection: ioredis and node-redis queue everything behind it). */
export interface WaitConn extends Conn {
    /** Sends two commands in one write (the server runs them in one go);
     * their replies. */
    sendPair(a: Arg[], b: Arg[]): [Promise<unknown>, Promise<unknown>];
    /** Done with it: back to the pool. */
    idle(): void;
    /** Closed at once (an aborted wait: the server drops its place in line,
     * or takes back a grant it could not deliver). */
    destroy(): void;
}
/** ioredis or node-redis, as the user made it. */
export type RedisLike = any;
/** The user's client as a [`Conn`] that can open wait connections. */
export interface Client extends Conn {
    /** A connection for a blocking wait (from a pool of idle ones). */
    waitConn(): Promise<WaitConn>;
    /** Closes the idle wait connections. */
    close(): Promise<void>;
}
/** The user's client; wait connections are duplicates of it, kept idle
 * between waits (so a grant costs no connection setup). */
export declare function wrap(client: RedisLike): Client;
