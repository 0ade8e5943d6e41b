// The PostgreSQL JDBC driver run as its users run it, by the steps a test gives it on
// standard input, one a line, tab-separated (tests/server/test_jdbc_node.py):
//   connect  USER  PASSWORD  [URL-OPTIONS]   (a new connection: jdbc:postgresql://localhost:PORT/db?sslmode=verify-full&sslrootcert=CA&OPTIONS)
//   query    SQL   [PARAM...]                (a PreparedStatement; its rows)
//   update   SQL   [PARAM...]                (executeUpdate; its count)
//   repeat   N     SQL [PARAM...]            (one PreparedStatement run N times: past the
//                                             driver's prepareThreshold it is a named,
//                                             server-side statement; the last rows)
//   batch    SQL   PARAM;PARAM...  ...        (addBatch of each argument's parameters)
//   autocommit true|false | commit | rollback
//   meta     NAME  [ARG...]                   (a DatabaseMetaData method: getTables ...)
//   cancel   MS    SQL                        (Statement.cancel() after MS milliseconds)
//   timeout  S     SQL                        (setQueryTimeout(S))
// A PARAM is TYPE:VALUE: int, long, str, dec, double, bool, date (java.sql.Date), ts
// (java.sql.Timestamp), odt (OffsetDateTime), ldt (LocalDateTime), ld (LocalDate),
// bytes (hex), null (a java.sql.Types name).
// Each step prints one line: "ok " and its rows (a value as Class:value, columns joined by
// " | ", rows by " ; "), or "err SQLSTATE message".
import java.math.BigDecimal;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.sql.*;
import java.time.*;
import java.util.*;

public class JdbcSteps {
    static String port, ca;
    static Connection con;

    public static void main(String[] args) throws Exception {
        port = args[0];
        ca = args[1];
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, "UTF-8"));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isEmpty()) continue;
            String[] f = line.split("\t", -1);
            String out;
            try {
                out = "ok " + step(f);
            } catch (SQLException e) {
                out = "err " + e.getSQLState() + " " + e.getMessage();
            }
            System.out.println(out.replace("\n", " "));
            System.out.flush();
        }
        if (con != null) con.close();
    }

    static String step(String[] f) throws Exception {
        switch (f[0]) {
            case "connect": {
                if (con != null) con.close();
                String url = "jdbc:postgresql://localhost:" + port + "/db?sslmode=verify-full&sslrootcert="
                        + ca + (f.length > 3 && !f[3].isEmpty() ? "&" + f[3] : "");
                Properties p = new Properties();
                p.setProperty("user", f[1]);
                p.setProperty("password", f[2]);
                con = DriverManager.getConnection(url, p);
                return "connected";
            }
            case "query": {
                try (PreparedStatement ps = con.prepareStatement(f[1])) {
                    bind(ps, f, 2);
                    try (ResultSet rs = ps.executeQuery()) { return rows(rs); }
                }
            }
            case "update": {
                try (PreparedStatement ps = con.prepareStatement(f[1])) {
                    bind(ps, f, 2);
                    return String.valueOf(ps.executeUpdate());
                }
            }
            case "repeat": {
                String last = "";
                try (PreparedStatement ps = con.prepareStatement(f[2])) {
                    for (int i = 0; i < Integer.parseInt(f[1]); i++) {
                        bind(ps, f, 3);
                        if (ps.execute()) {
                            try (ResultSet rs = ps.getResultSet()) { last = rows(rs); }
                        } else {
                            last = String.valueOf(ps.getUpdateCount());
                        }
                    }
                }
                return last;
            }
            case "batch": {
                try (PreparedStatement ps = con.prepareStatement(f[1])) {
                    for (int i = 2; i < f.length; i++) {
                        bind(ps, ("x\tx\t" + f[i].replace(";", "\t")).split("\t", -1), 2);
                        ps.addBatch();
                    }
                    return Arrays.toString(ps.executeBatch());
                }
            }
            case "autocommit": con.setAutoCommit(Boolean.parseBoolean(f[1])); return "autocommit";
            case "commit": con.commit(); return "commit";
            case "rollback": con.rollback(); return "rollback";
            case "meta": return meta(f);
            case "cancel": {
                Statement st = con.createStatement();
                Thread canceller = new Thread(() -> {
                    try { Thread.sleep(Long.parseLong(f[1])); st.cancel(); } catch (Exception e) { }
                });
                canceller.start();
                try { return rows(st.executeQuery(f[2])); } finally { canceller.join(); st.close(); }
            }
            case "timeout": {
                try (Statement st = con.createStatement()) {
                    st.setQueryTimeout(Integer.parseInt(f[1]));
                    return rows(st.executeQuery(f[2]));
                }
            }
            default: throw new IllegalArgumentException("unknown step " + f[0]);
        }
    }

    static String meta(String[] f) throws SQLException {
        DatabaseMetaData md = con.getMetaData();
        switch (f[1]) {
            case "product": return md.getDatabaseProductName() + " " + md.getDatabaseMajorVersion();
            case "getTables": return rows(md.getTables(null, "public", f[2], new String[] {"TABLE", "VIEW"}));
            case "getColumns": return rows(md.getColumns(null, "public", f[2], "%"));
            case "getPrimaryKeys": return rows(md.getPrimaryKeys(null, "public", f[2]));
            case "getIndexInfo": return rows(md.getIndexInfo(null, "public", f[2], false, true));
            case "getImportedKeys": return rows(md.getImportedKeys(null, "public", f[2]));
            case "getExportedKeys": return rows(md.getExportedKeys(null, "public", f[2]));
            case "getTypeInfo": return rows(md.getTypeInfo());
            case "getSchemas": return rows(md.getSchemas());
            default: throw new IllegalArgumentException("unknown metadata " + f[1]);
        }
    }

    static void bind(PreparedStatement ps, String[] f, int from) throws Exception {
        for (int i = from; i < f.length; i++) {
            int n = i - from + 1;
            String p = f[i];
            int colon = p.indexOf(':');
            String type = p.substring(0, colon), v = p.substring(colon + 1);
            switch (type) {
                case "int": ps.setInt(n, Integer.parseInt(v)); break;
                case "long": ps.setLong(n, Long.parseLong(v)); break;
                case "str": ps.setString(n, v); break;
                case "dec": ps.setBigDecimal(n, new BigDecimal(v)); break;
                case "double": ps.setDouble(n, Double.parseDouble(v)); break;
                case "bool": ps.setBoolean(n, Boolean.parseBoolean(v)); break;
                case "date": ps.setDate(n, java.sql.Date.valueOf(v)); break;
                case "ts": ps.setTimestamp(n, Timestamp.valueOf(v)); break;
                case "odt": ps.setObject(n, OffsetDateTime.parse(v)); break;
                case "ldt": ps.setObject(n, LocalDateTime.parse(v)); break;
                case "ld": ps.setObject(n, LocalDate.parse(v)); break;
                case "bytes": ps.setBytes(n, hex(v)); break;
                case "null": ps.setNull(n, Types.class.getField(v).getInt(null) ); break;
                default: throw new IllegalArgumentException("unknown parameter type " + type);
            }
        }
    }

    static byte[] hex(String s) {
        byte[] b = new byte[s.length() / 2];
        for (int i = 0; i < b.length; i++) b[i] = (byte) Integer.parseInt(s.substring(2 * i, 2 * i + 2), 16);
        return b;
    }

    static String rows(ResultSet rs) throws SQLException {
        ResultSetMetaData md = rs.getMetaData();
        List<String> out = new ArrayList<>();
        while (rs.next()) {
            List<String> row = new ArrayList<>();
            for (int i = 1; i <= md.getColumnCount(); i++) {
                Object o = rs.getObject(i);
                if (o == null) row.add("null");
                else if (o instanceof byte[]) {
                    StringBuilder sb = new StringBuilder("byte[]:");
                    for (byte x : (byte[]) o) sb.append(String.format("%02x", x));
                    row.add(sb.toString());
                } else if (o instanceof BigDecimal) row.add("BigDecimal:" + ((BigDecimal) o).toPlainString());
                else row.add(o.getClass().getSimpleName() + ":" + o);
            }
            out.add(String.join(" | ", row));
        }
        return String.join(" ; ", out);
    }
}
